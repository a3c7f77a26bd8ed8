"""Faults and restarts: --resume on every launch, kill -9 anywhere, bad storage, concurrent runs."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import zygote
from conftest import TINY

import train
from training.checkpoint import load_checkpoint, save_checkpoint
from training.outcome import EXIT_BAD_INPUT, EXIT_STORAGE
from training.rundir import read_metrics


def records(run_dir):
    return read_metrics(Path(run_dir) / "metrics.jsonl")


def curve(run_dir):
    """What must survive any fault bit for bit: every step's losses and gradient norm, in order."""
    return [
        (r["step"], r.get("train/loss"), r.get("grad/norm"), r.get("val/loss"))
        for r in records(run_dir)
    ]


# -- --resume on every launch
# ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_resume_is_safe_on_every_launch(tmp_path, capsys, run_tiny):
    args = [
        "--name",
        "p",
        "--resume",
        "train.steps=8",
        "train.checkpoint_every=4",
        "train.eval_every=4",
    ]
    assert run_tiny(*args) == 0  # no run directory: starts at step 0
    assert [r["step"] for r in records(tmp_path / "p")] == list(range(0, 9))
    capsys.readouterr()
    assert run_tiny(*args) == 0  # finished: says so, touches nothing
    assert "already finished" in capsys.readouterr().out  # a result: stdout
    assert (
        run_tiny("--name", "ref", "train.steps=8", "train.checkpoint_every=4", "train.eval_every=4")
        == 0
    )
    assert curve(tmp_path / "p") == curve(tmp_path / "ref")
    # a run directory with logs but no checkpoint yet (killed before its first checkpoint): starts
    # over
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "metrics.jsonl").write_text('{"step": 1, "train/loss": 9.0}\n{"step": 2, "tr')
    assert run_tiny(*args[:1], "q", *args[2:]) == 0
    assert "no checkpoint" in capsys.readouterr().out and curve(tmp_path / "q") == curve(
        tmp_path / "ref"
    )
    # a different config under the same name is refused, in one line
    assert run_tiny("--name", "q", "--resume", "optim.lr=0.1") == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differs from the saved" in err[0] and "optim.lr" in err[0]


# -- kill -9 anywhere
# ----------------------------------------------------------------------------------------------
POINTS = ["start", "config", "step", "log", "eval", "checkpoint", "checkpoint_swap", "summary"]


@pytest.mark.slow
def test_kill_9_anywhere_then_relaunch_gives_the_uninterrupted_curve(
    tmp_path, corpus_file, prepared
):
    """SIGKILL at 12 moments: random times in start-up (imports, data preparation, kernel loading)
    and every named point of a run (config written, steps, metrics records, evals, mid-checkpoint,
    between the checkpoint renames, before the summary), each followed by the same command, as a
    preemptible scheduler does. The final metrics.jsonl equals an uninterrupted run's bit for bit,
    with every step exactly once."""
    common = [
        sys.executable,
        "train.py",
        "--config",
        TINY,
        "--resume",
        f"data.source=text:{corpus_file}",
        "data.vocab_size=320",
        "data.val_fraction=0.1",
        "train.steps=60",
        "train.eval_every=3",
        "train.checkpoint_every=2",
        "log.stats_every=2",
        "train.sample_tokens=0",
    ]
    env = {k: v for k, v in os.environ.items() if k != "NORMLAB_KILL_AT"} | {"OMP_NUM_THREADS": "1"}
    ref = subprocess.run(
        # the reference on the session's copy of the same data (preparing is deterministic)
        [*common, "--name", "ref", f"log.out_dir={tmp_path}", f"data.root={prepared.parent}"],
        cwd=train.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    cmd = [
        *common,
        "--name",
        "f",
        f"log.out_dir={tmp_path}",
        f"data.root={tmp_path / 'd1'}",
    ]  # prepares anew
    rng = random.Random(0)
    t = lambda: ("time", round(rng.uniform(0.3, 1.9), 2))  # noqa: E731  (start-up takes ~1.9 s here)
    # in run order, so that no launch can finish before its kill: each point is reached in every
    # launch
    plan = [
        ("point", "config:1"),
        t(),
        ("point", "start:1"),
        t(),
        ("point", f"step:{rng.randint(1, 3)}"),
        t(),
        ("point", "eval:1"),
        ("point", f"log:{rng.randint(1, 3)}"),
        t(),
        ("point", f"checkpoint:{rng.randint(1, 2)}"),
        ("point", "checkpoint_swap:1"),
        ("point", "summary:1"),
    ]
    for kind, arg in plan:
        if kind == "point":
            code = subprocess.run(
                cmd,
                cwd=train.REPO,
                env={**env, "NORMLAB_KILL_AT": arg},
                capture_output=True,
                timeout=300,
            ).returncode
        else:
            with zygote.real():  # a process started as usual: the kill can land in its imports
                p = subprocess.Popen(
                    cmd,
                    cwd=train.REPO,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            time.sleep(arg)
            p.send_signal(signal.SIGKILL)
            code = p.wait(timeout=60)
        assert code == -signal.SIGKILL, f"kill at {kind} {arg}: the launch ended with {code} first"
    r = subprocess.run(cmd, cwd=train.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]  # the same command, once more, finishes the run
    assert json.loads((tmp_path / "f" / "summary.json").read_text())["steps"] == 60
    # none missing, none duplicated
    assert [r["step"] for r in records(tmp_path / "f")] == list(range(0, 61))
    assert curve(tmp_path / "f") == curve(tmp_path / "ref")
    print(
        f"kill -9 at {len(plan)} points ({', '.join(str(a) for _, a in plan)}): 0 differing "
        "losses, "
        f"0 missing or duplicated steps"
    )


# -- storage faults
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_unreadable_latest_checkpoint_falls_back_to_previous(tmp_path, capsys, run_tiny):
    base = ["train.steps=8", "train.checkpoint_every=2", "train.eval_every=4"]
    assert run_tiny("--name", "ref", *base) == 0
    assert run_tiny("--name", "c", *base, "train.stop_at=6") == 0
    ckpt = tmp_path / "c" / "checkpoints"
    assert (
        load_checkpoint(ckpt / "previous.pt")["step"] == 4
        and load_checkpoint(ckpt / "latest.pt")["step"] == 6
    )
    data = (ckpt / "latest.pt").read_bytes()
    (ckpt / "latest.pt").write_bytes(data[: len(data) // 2])  # truncated
    capsys.readouterr()
    assert (
        train.main(["--name", "c", "--resume", f"log.out_dir={tmp_path}", "train.stop_at=0"]) == 0
    )
    assert "resuming from previous.pt (step 4)" in capsys.readouterr().err
    assert curve(tmp_path / "c") == curve(tmp_path / "ref")
    # both unreadable: one line, exit 2, the files left as they are
    for name in ("latest.pt", "previous.pt"):
        (ckpt / name).write_bytes(b"not a checkpoint")
    assert train.main(["--name", "c", "--resume", f"log.out_dir={tmp_path}", "train.steps=10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read checkpoint" in err[0] and "previous.pt" in err[0]


@pytest.mark.slow
def test_checkpoint_of_another_shape_and_torn_metrics(tmp_path, capsys, run_tiny):
    assert run_tiny("--name", "s", "train.steps=6", "train.stop_at=4") == 0
    ckpt = tmp_path / "s" / "checkpoints" / "latest.pt"
    good = ckpt.read_bytes()
    assert run_tiny("--name", "o", "train.steps=2", "model.dim=64") == 0
    ckpt.write_bytes((tmp_path / "o" / "checkpoints" / "latest.pt").read_bytes())
    capsys.readouterr()
    assert train.main(["--name", "s", "--resume", f"log.out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit this config" in err[0]
    ckpt.write_bytes(good)  # a metrics.jsonl torn mid-line by a crash is repaired on resume
    with open(tmp_path / "s" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "train/lo')
    assert train.main(["--name", "s", "--resume", f"log.out_dir={tmp_path}"]) == 0
    assert [r["step"] for r in records(tmp_path / "s")] == list(range(0, 7))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated_bin", "corrupt_meta"])
def test_damaged_prepared_data_is_one_line(tmp_path, corpus_file, capsys, damage):
    from data.prepare import prepare

    prepared = prepare(
        f"text:{corpus_file}", vocab_size=320, val_fraction=0.1, root=tmp_path / "d", verbose=False
    )
    if damage == "truncated_bin":
        data = (prepared / "train.bin").read_bytes()
        (prepared / "train.bin").write_bytes(data[:1001])
    else:
        (prepared / "meta.json").write_text('{"digest": "abc", "dtype": ')
    capsys.readouterr()
    args = [
        "--config",
        TINY,
        f"log.out_dir={tmp_path / 'runs'}",
        f"data.source=text:{corpus_file}",
        f"data.root={tmp_path / 'd'}",
        "data.vocab_size=320",
        "data.val_fraction=0.1",
    ]
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is damaged" in err[-1] and "delete the directory" in err[-1]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["checkpoint", "log"])
def test_disk_full_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch, capsys, where, run_tiny
):
    assert (
        run_tiny("--name", "e", "train.steps=8", "train.checkpoint_every=2", "train.stop_at=4") == 0
    )

    def enospc(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if where == "checkpoint":
        monkeypatch.setattr(torch, "save", enospc)
    else:
        from normlab import files

        monkeypatch.setattr(files.json, "dumps", enospc)
    capsys.readouterr()
    code = train.main(["--name", "e", "--resume", f"log.out_dir={tmp_path}", "train.stop_at=0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_STORAGE == 4
    assert err[-1].startswith("error: cannot write the run's files") and "No space left" in err[-1]
    assert [e for e in err if e.startswith("error")] == [err[-1]] and not any(
        "Traceback" in e for e in err
    )
    monkeypatch.undo()
    # the last good one
    assert load_checkpoint(tmp_path / "e" / "checkpoints" / "latest.pt")["step"] == 4
    assert (
        train.main(["--name", "e", "--resume", f"log.out_dir={tmp_path}", "train.stop_at=0"]) == 0
    )


def test_a_run_that_could_write_nothing_is_not_told_its_checkpoint_is_intact(
    tmp_path, capsys, data_args
):
    """The run folder cannot be made (its parent is a file): bad input, not a storage fault (code 2,
    issue 78); the line names the path and the way on without claiming a checkpoint the run never
    wrote; once the path is free the run starts."""
    (tmp_path / "f").write_text("a file")
    args = ["--config", TINY, *data_args, "--name", "n", "train.steps=2", "train.sample_tokens=0"]
    code = train.main([*args, f"log.out_dir={tmp_path / 'f' / 'runs'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and err[-1].startswith("error: cannot write the run's files")
    assert "intact" not in err[-1] and "choose another log.out_dir" in err[-1], err
    (tmp_path / "f").unlink()
    (tmp_path / "f").mkdir()
    assert train.main([*args, "--resume", f"log.out_dir={tmp_path / 'f' / 'runs'}"]) == 0


def test_interrupted_checkpoint_write_keeps_both_checkpoints(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "latest.pt"
    save_checkpoint(path, {"step": 1})
    save_checkpoint(path, {"step": 2})
    assert (
        load_checkpoint(path)["step"] == 2
        and load_checkpoint(path.with_name("previous.pt"))["step"] == 1
    )


# -- concurrent use
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_processes_with_the_same_name_never_interleave(tmp_path, data_args):
    cmd = [
        sys.executable,
        "train.py",
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "--name",
        "same",
        "--resume",
        "train.steps=100000",
        "train.sample_tokens=0",
    ]  # still running when the second starts
    first = subprocess.Popen(
        cmd, cwd=train.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        for _ in range(600):  # until the first holds the run
            if (tmp_path / "same" / "metrics.jsonl").exists():
                break
            time.sleep(0.05)
        second = subprocess.run(cmd, cwd=train.REPO, capture_output=True, text=True, timeout=300)
        err = second.stderr.strip().splitlines()
        assert (
            second.returncode == 2
            and err[-1].startswith("error: run")
            and "in use by another process" in err[-1]
        )
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
    steps = [r["step"] for r in records(tmp_path / "same")]
    assert steps == list(range(0, len(steps)))


@pytest.mark.slow
def test_two_prepares_of_one_dataset_build_it_once(tmp_path, corpus_file):
    cmd = [
        sys.executable,
        "-m",
        "data.prepare",
        "--source",
        f"text:{corpus_file}",
        "--vocab-size",
        "320",
        "--root",
        str(tmp_path),
    ]
    procs = [
        subprocess.Popen(
            cmd, cwd=train.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    # the second waited, then hit the cache
    assert sum("training a 320-piece" in out for out, _ in outs) == 1  # progress: stdout
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 1


# -- sweeps ------------------------------------------------------------------------------------
SWEEP_STEPS = (
    400  # ~2 s a run: both are still in flight when the test strikes after their first checkpoints
)


def _sweep_cmd(tmp_path, data_args, steps=SWEEP_STEPS):
    """A two-run sweep on the session's prepared corpus (its preparation is not under test)."""
    study = tmp_path / "s.yaml"
    study.write_text(
        f"name: s\nconfig: {TINY}\n"
        f"overrides: {{train: {{steps: {steps}, checkpoint_every: 20, eval_every: 100, "
        "sample_tokens: 0}}\n"
        "grid: {lr: [1.0e-3, 3.0e-3]}\nworkers: 2\n"
    )
    return [
        sys.executable,
        "lab/sweep.py",
        str(study),
        "--out",
        str(tmp_path / "out"),
        "--no-report",
        "--set",
        *(a for a in data_args if a.startswith("data.")),
    ]


def _runs_in_flight(study_dir) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", str(study_dir / "runs")], capture_output=True, text=True
    ).stdout
    return [int(p) for p in out.split()]


def _wait_for(predicate, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_sweep_interrupt_stops_its_runs_and_a_rerun_continues(tmp_path, data_args):
    cmd = _sweep_cmd(tmp_path, data_args)
    study_dir = tmp_path / "out" / "s"
    # started as a background job of a script is (SIGINT ignored, inherited): the sweep must still
    # stop on kill -INT
    sweep = subprocess.Popen(
        cmd,
        cwd=train.REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert _wait_for(lambda: len(list(study_dir.glob("runs/*/checkpoints/latest.pt"))) == 2)
    # to the sweep alone, as `kill -INT` (a terminal's Ctrl-C reaches all)
    sweep.send_signal(signal.SIGINT)
    assert sweep.wait(timeout=120) == 130
    assert _runs_in_flight(study_dir) == []  # no orphans: the sweep waited for its runs
    for run_dir in study_dir.glob("runs/*/"):
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    r = subprocess.run(cmd, cwd=train.REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    index = json.loads((study_dir / "sweep.json").read_text())["runs"]
    assert [e["status"] for e in index] == ["ok", "ok"] or all(
        e["status"] in ("ok", "plateau") for e in index
    )
    assert all(e["resumed"] for e in index)
    for run_dir in study_dir.glob("runs/*/"):
        assert [r["step"] for r in records(run_dir)] == list(range(0, SWEEP_STEPS + 1))


@pytest.mark.slow
def test_a_second_interrupt_stops_a_sweep_at_once_in_one_line(tmp_path, data_args):
    """Ctrl-C twice: the first asks the runs to stop at a checkpoint, the second ends the sweep at
    once with exit 130 and one line, no traceback; its files are whole and a rerun finishes."""
    cmd = _sweep_cmd(tmp_path, data_args)
    study_dir = tmp_path / "out" / "s"
    sweep = subprocess.Popen(
        cmd, cwd=train.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert _wait_for(lambda: len(list(study_dir.glob("runs/*/checkpoints/latest.pt"))) == 2)
    sweep.send_signal(signal.SIGINT)
    time.sleep(0.3)
    sweep.send_signal(signal.SIGINT)
    assert sweep.wait(timeout=60) == 130
    err = sweep.stderr.read()
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted again")
    assert _wait_for(lambda: _runs_in_flight(study_dir) == [], 30)  # none outlives it
    json.loads((study_dir / "sweep.json").read_text())  # whole
    r = subprocess.run(cmd, cwd=train.REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.slow
def test_sweep_worker_killed_mid_run_is_resumed_by_the_rerun(tmp_path, data_args):
    cmd = _sweep_cmd(tmp_path, data_args)
    study_dir = tmp_path / "out" / "s"
    sweep = subprocess.Popen(
        cmd, cwd=train.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert _wait_for(lambda: len(list(study_dir.glob("runs/*/checkpoints/latest.pt"))) >= 1)
    # a run with a checkpoint
    name = next(study_dir.glob("runs/*/checkpoints/latest.pt")).parent.parent.name
    victim = json.loads((study_dir / "runs" / name / "meta.json").read_text())[
        "pid"
    ]  # its worker process
    assert victim in _runs_in_flight(study_dir)
    os.kill(victim, signal.SIGKILL)  # the OOM killer, a node failure...
    assert sweep.wait(timeout=300) == 0
    index = json.loads((study_dir / "sweep.json").read_text())["runs"]
    killed = [e for e in index if e["status"] == "failed"]
    assert len(killed) == 1 and killed[0]["name"] == name and killed[0]["exit_code"] == -9, index
    assert "killed" in killed[0]["error"]
    r = subprocess.run(cmd, cwd=train.REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    index = {e["name"]: e for e in json.loads((study_dir / "sweep.json").read_text())["runs"]}
    assert index[killed[0]["name"]]["resumed"] and index[killed[0]["name"]]["status"] in (
        "ok",
        "plateau",
    ), index
    assert [r["step"] for r in records(study_dir / "runs" / killed[0]["name"])] == list(
        range(0, SWEEP_STEPS + 1)
    )
