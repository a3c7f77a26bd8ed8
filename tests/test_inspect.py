"""python -m normlab.inspect: one page for one run or several, spikes named by their step, runs
labelled by what differs; summary.json records the spikes' steps."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import imported

from training.config import load_config, to_yaml
from training.rundir import spike_steps, summarize

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "train" / "tiny.yaml"


def make_run(root: Path, name: str, spike_at: int | None, overrides=()) -> Path:
    """A run directory made by hand: 60 steps of a smoothly falling, slightly noisy loss, one loss
    spike (x3) and one gradient-norm spike (x10) at `spike_at`, per-layer metrics every 10 steps."""
    cfg = load_config(TINY, ["train.steps=60", *overrides])
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(to_yaml(cfg))
    records = [{"step": 0, "val/loss": 5.5}]
    for s in range(1, 61):
        loss = 2.5 + 3.0 * math.exp(-s / 20) + 0.01 * math.sin(7 * s)
        grad = 1.0 + 0.05 * math.cos(5 * s)
        if s == spike_at:
            loss, grad = loss * 3, grad * 10
        if spike_at and s == spike_at - 1:  # the gradient norm rises the step before
            grad *= 3
        r = {"step": s, "train/loss": loss, "grad/norm": grad, "train/lr": 1e-3}
        if s % 10 == 0:
            r |= {f"grad/norm/layer_{i}": grad / (i + 1) for i in range(2)}
            r |= {f"act/rms/layer_{i}": 1.0 + i + s / 60 for i in range(2)}
            r |= {f"attn/logit_max/layer_{i}": 3.0 + i for i in range(2)}
            r |= {"val/loss": loss}
        records.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = summarize(
        records,
        status="ok",
        steps_done=60,
        total_steps=60,
        diverged_at=None,
        unigram_entropy=4.0,
        spike_window=5,
        spike_k=5.0,
        wall_time_s=1.0,
    )
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def inspect(*args: str, cwd: Path, imports: bool = False) -> subprocess.CompletedProcess:
    """python -m normlab.inspect as a user runs it; `imports`: Python's import log on stderr."""
    cmd = [sys.executable, *(["-X", "importtime"] if imports else []), "-m", "normlab.inspect"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_summary_records_the_steps_of_the_spikes_it_scores(tmp_path):
    run = make_run(tmp_path, "a", spike_at=31)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["spikes/loss"] == [31] and summary["spikes/grad_norm"] == [30, 31]
    assert summary["spike_score/loss"] > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert spike_steps(records, "train/loss", 5, 5.0) == [31]


@pytest.mark.slow  # a subprocess drawing a figure sheet
def test_two_runs_side_by_side_name_the_spike_step_and_what_differs(tmp_path):
    a = make_run(tmp_path / "runs", "rms", spike_at=31)
    b = make_run(tmp_path / "runs", "ln", spike_at=None, overrides=["model.norm=layernorm"])
    r = inspect(str(a), str(b), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # results on stdout, nothing on stderr for a clean run
    out = tmp_path / "inspect" / "rms+1"
    page = (out / "page.md").read_text()
    assert "| norm=rmsnorm | ok |" in page and "| norm=layernorm | ok |" in page
    assert "| 31 |" in page
    said = r"spike at step 31: grad norm x(9|10)\.\d with it; grad norm x3\.\d at step 30 before it"
    assert re.search(said, page)
    assert "![stability metrics of the runs](runs.png)" in page
    assert (out / "runs.png").stat().st_size > 20_000
    assert "loss spike at step 31" in r.stdout and r.stdout.rstrip().endswith("runs.png)")
    assert not (a / "page.md").exists() and not (a / "report.md").exists()  # runs left alone


@pytest.mark.slow
def test_one_run_is_labelled_by_its_name_and_bad_paths_are_one_line(tmp_path):
    a = make_run(tmp_path / "runs", "solo", spike_at=None)
    r = inspect(str(a), "--out", str(tmp_path / "look"), cwd=tmp_path, imports=True)
    assert r.returncode == 0 and "| solo | ok |" in r.stdout and "none |" in r.stdout
    # reading runs needs no torch (~1.5 s of start-up)
    assert not imported(r.stderr, "torch")
    r = inspect(str(tmp_path / "nope"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such folder" in r.stderr
    (tmp_path / "empty").mkdir()
    r = inspect(str(tmp_path / "empty"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no monitored run" in r.stderr
    r = inspect(str(a), "--out", str(a / "x"), cwd=tmp_path)
    assert r.returncode == 2 and "inside a run directory" in r.stderr
    (a / "config.yaml").write_text("model: {dim: [\n")  # a hand edit that is not YAML
    r = inspect(str(a), "--out", str(tmp_path / "look"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "config.yaml is not YAML" in r.stderr


@pytest.mark.slow
def test_a_trained_runs_summary_has_its_spike_steps(run_tiny, tmp_path):
    assert run_tiny("--name", "t") == 0
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert isinstance(summary["spikes/loss"], list) and isinstance(
        summary["spikes/grad_norm"], list
    )
