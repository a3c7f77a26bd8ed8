"""The benchmark scripts run end to end at toy sizes and print their tables (no timing is
asserted)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY

from bench.benchlib import ISA_ENV

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def _script(name: str, *args: str, env: dict | None = None) -> str:
    """Run bench/<name>.py as a user does (nothing imports bench/); its stdout."""
    r = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_bench_train_compares_the_same_model_through_each_librarys_loss():
    # tiny.yaml: dim 32, GQA 4/2 heads; bench_train exits if any variant, transformers' Llama
    # trained through labels / shift_labels included, starts from a different loss than the others
    out = _script("bench_train", "--config", TINY, "--rounds", "1", "--no-compile")
    for row in (
        "| ours rmsnorm (fused) |",
        "| ours layernorm (reference) |",
        "| transformers Llama |",
        "| ours rmsnorm (fused) / ours layernorm (fused) |",
        "| rmsnorm (fused) |",
        "### rmsnorm (fused)",
    ):
        assert row in out


def test_bench_train_only_keeps_the_named_variants_and_the_baseline():
    out = _script(
        "bench_train",
        "--config",
        TINY,
        "--rounds",
        "1",
        "--no-compile",
        "--no-breakdown",
        "--only",
        "layernorm (fused)",
    )
    rows = [
        line.split("|")[1].strip()
        for line in out.splitlines()
        if line.startswith("| ")
        and "tokens/s" not in line
        and " / " not in line
        and "pair" not in line
    ]
    assert rows == ["ours layernorm (fused)", "transformers Llama"]


def test_bench_norms_prints_every_implementation_and_saves_what_it_printed(tmp_path):
    saved = tmp_path / "bench" / "norms.md"
    args = ["--shapes", "4x8x64", "--dtypes", "float32", "--repeats", "2", "--no-compile"]
    isa = {
        k: v for k, v in os.environ.items() if k not in ISA_ENV
    }  # only the one set here is named
    out = _script(
        "bench_norms", *args, "--save", str(saved), env={**isa, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    )
    for row in (
        "| rmsnorm | ours (fused) |",
        "| rmsnorm | torch.nn.RMSNorm |",
        "| layernorm | ours (fused) |",
        "| layernorm | torch.nn.LayerNorm(bias=False) |",
        "| floor | copy + elementwise backward |",
    ):
        assert row in out
    # the saved file: the command and the machine (what the ratios depend on), then exactly the
    # printed tables
    head, _, body = saved.read_text().partition("\n\nMachine: ")
    assert head.startswith(
        f"`MKL_ENABLE_INSTRUCTIONS=AVX2 python -m bench.bench_norms {' '.join(args)} --save "
        f"{saved}` on "
    )  # the environment that picks the instruction set, as it ran
    machine, _, tables = body.partition("\n")
    assert "cores, ISA: " in machine and "torch threads" in machine
    assert tables == out


def test_bench_step_alternates_variants_and_splits_the_step_by_phase_and_op_family():
    """bench_step on the quick study's tiny model: every named variant has a row (ms, GFLOP/s, share
    of the measured peak, speed ratio), and a breakdown's phase and family shares each add up to the
    whole step."""
    out = _script(
        "bench_step",
        "--study",
        "lab/studies/quick.yaml",
        "--rounds",
        "2",
        "--steps",
        "1",
        "--profile-steps",
        "1",
        "--variant",
        "current",
        "pairwise RoPE",
        "for-loop AdamW",
        "--breakdown",
        "current",
    )
    rows = {
        line.split("|")[1].strip()
        for line in out.splitlines()
        if line.startswith("| ") and "ms" not in line
    }
    assert {"current", "pairwise RoPE", "for-loop AdamW"} <= rows and "peak = " in out
    # the first variant against itself
    assert "| current | " in out and "| 1.00 (1.00..1.00) |" in out
    tables = out.split("### Where the step goes: current")[1].split("\n\n")
    phases, families = (
        {
            k.strip(): v
            for k, v in (line.strip("| ").split(" | ") for line in t.strip().splitlines()[2:])
        }
        for t in (tables[1], tables[2])
    )
    assert {"forward", "backward", "optimizer", "clip"} <= set(phases) and "matmul" in families
    for shares in (phases, families):
        assert sum(float(v.strip(" %")) for v in shares.values()) == pytest.approx(100, abs=0.5)


def test_bench_study_times_both_modes_on_the_same_runs_and_breaks_a_run_down(tmp_path, corpus_file):
    data = [
        f"data.source=text:{corpus_file}",
        f"data.root={tmp_path / 'd'}",
        "data.vocab_size=320",
        "data.val_fraction=0.1",
        "train.steps=6",
        "train.eval_every=3",
    ]
    out = _script(
        "bench_study",
        "--study",
        "lab/studies/quick.yaml",
        "--runs",
        "1",
        "--rounds",
        "1",
        "--workers",
        "1",
        "--set",
        *data,
    )
    for row in (
        "| start-up and exit |",
        "| steps |",
        "| **total** |",
        "| 1 | ",
        "| the rest of the run (data, model, evals, checkpoints) |",
    ):
        assert row in out
    assert "Persistent workers / process per run: **" in out and "median of 1 rounds" in out


def test_the_monitors_cost_in_usage_md_is_the_saved_benchmarks():
    """docs/usage.md's overhead sentence quotes bench/results/monitor.md's medians and spreads."""
    rows = [
        line.split("|")[1:-1]
        for line in (REPO / "bench" / "results" / "monitor.md").read_text().splitlines()
        if line.startswith("| normlab") or line.startswith("| transformers")
    ]
    got = {(r[0].strip(), r[1].strip()): (r[3].strip(), r[4].strip()) for r in rows}
    text = " ".join((REPO / "docs" / "usage.md").read_text().split())
    for model in ("normlab default", "transformers Llama"):
        probed, _ = got[(model, "every step")]
        amortized, spread = got[(model, "every 25 (default)")]
        assert f"x{probed}" in text and f"x{amortized}" in text
        assert spread.replace("..", "-") in text
