"""The benchmark scripts run end to end at toy sizes and print their tables (no timing is asserted)."""

import pytest

from scripts import bench_norms, bench_train

pytestmark = pytest.mark.slow
TINY = str(bench_train.REPO / "configs" / "tiny.yaml")


def test_bench_train_compares_the_same_model_through_each_librarys_loss(capsys):
    # tiny.yaml: dim 32, GQA 4/2 heads; bench_train exits if any variant, transformers' Llama trained
    # through labels / shift_labels included, starts from a different loss than the others
    assert bench_train.main(["--config", TINY, "--rounds", "2", "--no-compile"]) == 0
    out = capsys.readouterr().out
    for row in ("| ours rmsnorm (fast) |", "| ours layernorm (reference) |", "| transformers Llama |",
                "| ours rmsnorm (fast) / ours layernorm (fast) |", "| rmsnorm (fast) |", "### rmsnorm (fast)"):
        assert row in out


def test_bench_train_only_keeps_the_named_variants_and_the_baseline(capsys):
    assert bench_train.main(["--config", TINY, "--rounds", "1", "--no-compile", "--no-breakdown",
                             "--only", "layernorm (fast)"]) == 0
    rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "tokens/s" not in line and " / " not in line and "pair" not in line]
    assert rows == ["ours layernorm (fast)", "transformers Llama"]


def test_bench_norms_prints_every_implementation(capsys):
    assert bench_norms.main(["--shapes", "4x8x64", "--dtypes", "float32", "--repeats", "2", "--no-compile"]) == 0
    out = capsys.readouterr().out
    for row in ("| rmsnorm | ours (fast) |", "| rmsnorm | torch.nn.RMSNorm |", "| layernorm | ours (fast) |",
                "| layernorm | torch.nn.LayerNorm(bias=False) |", "| floor | copy + elementwise backward |"):
        assert row in out
