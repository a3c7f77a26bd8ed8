"""scripts/export_hf.py: a run exported for transformers loads back with the same logits and
tokens."""

import subprocess
import sys

import pytest
import torch
from conftest import TINY

import train
from data.tokenizer import Tokenizer
from training.checkpoint import load_run

transformers = pytest.importorskip("transformers")


def _export(run_dir, out):
    return subprocess.run(
        [sys.executable, "-m", "scripts.export_hf", str(run_dir), str(out)],
        cwd=train.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize("tie", [False, True])
def test_export_loads_back_with_the_same_logits_and_tokens(tmp_path, data_args, corpus_file, tie):
    assert (
        train.main(
            [
                "--config",
                TINY,
                f"log.out_dir={tmp_path}",
                *data_args,
                "--name",
                "r",
                "train.steps=6",
                f"model.tie_embeddings={tie}",
            ]
        )
        == 0
    )
    r = _export(tmp_path / "r", tmp_path / "hf")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours, prepared = load_run(tmp_path / "r")
    tok = Tokenizer(prepared / "tokenizer.model")
    text = corpus_file.read_text()[:2000] + "  two spaces, a tab\there, digits 12345 and é"
    ids = tok.encode(text)
    assert hf_tok(text)["input_ids"] == ids and hf_tok.decode(ids) == text == tok.decode(ids)
    idx = torch.tensor([ids[:32], ids[32:64]])
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx)[0], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_inexpressible_runs_and_bad_paths_are_refused_in_one_line(tmp_path, data_args):
    assert (
        train.main(
            [
                "--config",
                TINY,
                f"log.out_dir={tmp_path}",
                *data_args,
                "--name",
                "ln",
                "train.steps=2",
                "--norm",
                "layernorm",
            ]
        )
        == 0
    )
    for run_dir, message in [
        (tmp_path / "ln", "cannot express model.norm='layernorm'"),
        (tmp_path / "nope", "is not a run directory"),
    ]:
        r = _export(run_dir, tmp_path / "out")
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1 and message in err[0], r.stderr
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
