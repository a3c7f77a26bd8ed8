"""A study's persistent workers (lab/worker.py, started by lab/runner.Worker): many runs in one
process compute what each computes alone with `python train.py`, and a run's failure stays that
run's."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY

import train
from lab.runner import Worker
from training.rundir import read_metrics

TIMING = {
    "train/tokens_per_s",
    "train/mfu",
}  # measured, not computed: differ between any two launches


def _argv(out, name, *overrides):
    return [
        "--config",
        TINY,
        "--name",
        name,
        "--resume",
        f"log.out_dir={out}",
        "train.steps=6",
        "train.eval_every=3",
        "train.checkpoint_every=3",
        "train.sample_tokens=8",
        "log.stats_every=2",
        "train.threads=1",
        *overrides,
    ]


def _same_run(a, b):
    ra, rb = read_metrics(a / "metrics.jsonl"), read_metrics(b / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k not in TIMING} for r in ra] == [
        {k: v for k, v in r.items() if k not in TIMING} for r in rb
    ]
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for s in (sa, sb):
        for k in ("wall_time_s", "tokens_per_s"):
            s.pop(k)
    assert sa == sb
    wa, wb = (
        torch.load(d / "checkpoints" / "latest.pt", weights_only=False)["model"] for d in (a, b)
    )
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_runs_in_one_worker_compute_what_train_py_computes_alone(tmp_path, data_args):
    """Bit for bit: a run after another run (another norm, placement, seed, LR) in the same worker,
    stopped and resumed there, equals the same run launched as its own process (uninterrupted:
    resuming is exact, tests/test_train.py), and so does the first."""
    worker = Worker(threads=1, gpu=None)
    first = _argv(
        tmp_path / "w",
        "a",
        "model.norm=layernorm",
        "model.placement=post",
        "optim.lr=3e-2",
        *data_args,
    )
    second = _argv(tmp_path / "w", "b", "model.norm=rmsnorm", "train.seed=1", *data_args)
    assert worker.run(first, tmp_path / "a.log") == 0
    pid = worker.proc.pid
    # stops at 3, resumable
    assert worker.run([*second, "train.stop_at=3"], tmp_path / "b.log") == 0
    assert worker.run(second, tmp_path / "b.log") == 0  # resumes from 3 in the same process
    assert worker.proc.pid == pid
    worker.close()
    for name, argv in (("a", first), ("b", second)):
        alone = [a.replace(str(tmp_path / "w"), str(tmp_path / "p")) for a in argv]
        r = subprocess.run(
            [sys.executable, str(train.REPO / "train.py"), *alone], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr[-2000:]
        _same_run(tmp_path / "w" / name, tmp_path / "p" / name)
    log = (tmp_path / "a.log").read_text()
    assert log.count("final val loss") == 1  # the run's own output went to its log


@pytest.mark.slow
def test_a_run_that_fails_stays_that_runs_failure(tmp_path, data_args, monkeypatch):
    """Bad input: exit 2, the worker goes on. A crash (here SIGKILL at a fault point, as the OOM
    killer would): that run's exit code, and the next run gets a fresh worker that trains it
    normally."""
    worker = Worker(threads=1, gpu=None)
    assert (
        worker.run(_argv(tmp_path, "bad", "model.norm=groupnorm", *data_args), tmp_path / "bad.log")
        == 2
    )
    assert "error: " in (tmp_path / "bad.log").read_text()
    pid = worker.proc.pid
    assert worker.run(_argv(tmp_path, "ok", *data_args), tmp_path / "ok.log") == 0
    assert worker.proc.pid == pid
    # the workers started from now on die at their 4th step
    monkeypatch.setenv("NORMLAB_KILL_AT", "step:4")
    killer = Worker(threads=1, gpu=None)
    assert killer.run(_argv(tmp_path, "killed", *data_args), tmp_path / "killed.log") == -9
    assert killer.proc.poll() == -9
    assert (
        killer.run(_argv(tmp_path, "after", "train.steps=3", *data_args), tmp_path / "after.log")
        == 0
    )
    assert json.loads((tmp_path / "after" / "summary.json").read_text())["steps"] == 3
    killer.close()
    worker.close()
    assert worker.proc.poll() == 0  # closing its requests ends a worker


@pytest.mark.slow
def test_a_malformed_request_gets_one_answer_line_and_the_worker_goes_on(tmp_path):
    """Not JSON, JSON without argv, argv not a list of strings: each answered with exit code 2 and
    one line saying what a request is (a traceback ended the worker before); then a well-formed
    request still runs."""
    log = tmp_path / "r.log"
    lines = [
        "not json",
        '{"log": "x"}',
        '{"argv": [1, 2], "log": "x"}',
        '["argv"]',
        json.dumps({"argv": ["--config", "nowhere.yaml"], "log": str(tmp_path / "no" / "r.log")}),
        json.dumps({"argv": ["--config", "nowhere.yaml"], "log": str(log)}),
    ]
    r = subprocess.run(
        [sys.executable, "-m", "lab.worker", "test"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=train.REPO,
        env={**os.environ, "PYTHONPATH": str(train.REPO)},
    )
    answers = [json.loads(a) for a in r.stdout.splitlines()]
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert [a["exit_code"] for a in answers] == [2] * 6
    assert all(a["error"].startswith("error: malformed request") for a in answers[:4])
    # a log folder that does not exist: the run never starts, one line names the log
    assert answers[4]["error"].startswith(f"error: cannot open the run's log {tmp_path / 'no'}")
    assert "does not exist" in log.read_text()  # the last one ran: its bad config is its own line
