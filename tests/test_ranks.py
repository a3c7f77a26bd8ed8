"""What happens on one rank only, and inputs too big or shaped wrong for the job: one line, within
seconds, the documented exit codes, nothing saved skipped on resume.

The multi-process cases run under torchrun as users launch it (--standalone: a free port of its
own), each rank's output in a file of its own so that its lines can be read apart, torchrun's report
giving each failed rank's exit code; faults fire on one chosen rank (NORMLAB_FAULT_RANK). An error
every rank shares (rank 0's writes, a bad input) exits every rank with its code, rank 0 printing the
line; a rank's own error is printed by that rank, which leaves at once (torchrun's root cause, with
its code), and torchrun stops the others (exit 5)."""

import errno
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import TINY

import train
from training.checkpoint import load_checkpoint, save_sharded
from training.config import ConfigError, load_config
from training.outcome import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_PEER, EXIT_STORAGE, storage_line
from training.parallel import split_batch
from training.rundir import read_metrics

QUICK = 60  # seconds a failing job may take, start-up included, on a busy 2-core machine
SHIM = Path(__file__).parent / "dist" / "per_rank.py"


@dataclass
class Job:
    codes: list  # each rank's exit code (torchrun's report; 0 when it is not listed)
    errs: list  # each rank's stderr, progress bars dropped
    seconds: float
    root: tuple | None  # (rank, exit code) of torchrun's root cause: the first process that failed
    report: str  # torchrun's own stderr
    outs: list  # each rank's stdout (its progress and results), progress bars dropped

    def errors(self) -> list[tuple[int, str]]:
        """(rank, line) of every `error:` line any rank printed."""
        return [
            (r, line)
            for r, err in enumerate(self.errs)
            for line in err.splitlines()
            if line.startswith("error:")
        ]

    def tracebacks(self) -> list[int]:
        return [r for r, err in enumerate(self.errs) if "Traceback" in err]


def launch(
    n: int,
    args: list[str],
    tmp_path: Path,
    env: dict | None = None,
    per_rank: dict | None = None,
    timeout: float = 2 * QUICK,
) -> Job:
    """train.py on n processes under torchrun --standalone (one thread each), each rank's output in
    a file of its own (--redirects 3); per_rank: {rank: extra arguments}."""
    logs = tmp_path / "torchrun-logs"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(n),
        "--redirects",
        "3",
        "--log-dir",
        str(logs),
        str(SHIM),
        "train.py",
        *args,
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PER_RANK": json.dumps(per_rank or {}),
        **(env or {}),
    }
    t0 = time.time()
    r = subprocess.run(
        cmd, cwd=train.REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    seconds, report = time.time() - t0, r.stderr
    errs, outs = [], []
    for i in range(n):
        for kind, into in (("stderr", errs), ("stdout", outs)):
            logged = logs.glob(f"*/attempt_0/{i}/{kind}.log")
            text = "".join(f.read_text() for f in logged).replace("\r", "\n")
            into.append("\n".join(line for line in text.splitlines() if "step/s" not in line))
    failed = dict(re.findall(r"rank\s+: (\d+) \(local_rank.*\n\s+exitcode\s+: (-?\d+)", report))
    root = re.search(r"Root Cause.*?rank\s+: (\d+).*?exitcode\s+: (-?\d+)", report, re.S)
    return Job(
        [int(failed.get(str(i), 0)) for i in range(n)],
        errs,
        seconds,
        root and tuple(map(int, root.groups())),
        report,
        outs,
    )


@pytest.fixture
def tiny(tmp_path, data_args):
    """The tiny config on the session's corpus, under tmp_path: 6 steps, a checkpoint every 2."""
    return [
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=6",
        "train.checkpoint_every=2",
        "train.eval_every=3",
        "train.sample_tokens=0",
    ]


def _one_line(job: Job, says: str, printer: int) -> None:
    """Within QUICK seconds, exactly one `error:` line, by `printer`, saying `says`; no rank's
    traceback, no gloo abort at exit."""
    assert job.seconds < QUICK, (job.seconds, job.errs)
    errors = job.errors()
    assert len(errors) == 1 and errors[0][0] == printer and says in errors[0][1], (
        job.errs,
        job.report[-3000:],
    )
    assert job.tracebacks() == [] and "terminate called" not in job.report + "".join(job.errs), (
        job.errs
    )


def _stopped_together(job: Job, code: int, says: str) -> None:
    """A shared error: every rank exited with `code`, rank 0 printed the one line."""
    _one_line(job, says, printer=0)
    assert job.codes == [code] * len(job.codes), (job.codes, job.report[-3000:])


def _stopped_by_torchrun(job: Job, rank: int, code: int) -> None:
    """One rank's own failure: torchrun's root cause, with `code`; the others stopped (exit 5)."""
    assert job.root == (rank, code), job.report[-3000:]
    assert [c for r, c in enumerate(job.codes) if r != rank] == [EXIT_PEER] * (
        len(job.codes) - 1
    ), job.codes
    assert job.seconds < QUICK and "terminate called" not in job.report + "".join(job.errs), (
        job.seconds
    )


# -- one rank's error: one line, torchrun stops the others -----------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "parallel,rank,fault,shared,says",
    [
        # rank 0's .pt save
        ("ddp", 0, "checkpoint:2:enospc", True, "error: cannot write the run's files"),
        # one rank, between collectives
        ("fsdp", 1, "log:4:enospc", False, "error: rank 1: cannot write the run's files"),
        # after its DCP shards
        ("fsdp", 0, "checkpoint:2:enospc", False, "error: cannot write the run's files"),
    ],
)
def test_one_rank_error_is_one_line_and_every_rank_stops_at_once(
    tmp_path, tiny, parallel, rank, fault, shared, says
):
    """rank 0's .pt save runs through on_master: every rank raises its error and exits 4. A rank's
    own error (its disk, between collectives): that rank prints and exits 4 at once, torchrun's
    report names it first, and the other rank, stopped by torchrun, exits 5 without a word (before:
    a store-based protocol of our own)."""
    job = launch(
        2,
        [*tiny, "--name", "f", f"train.parallel={parallel}"],
        tmp_path,
        env={"NORMLAB_KILL_AT": fault, "NORMLAB_FAULT_RANK": str(rank)},
    )
    if shared:
        _stopped_together(job, EXIT_STORAGE, says)
    else:
        _one_line(job, says, printer=rank)
        _stopped_by_torchrun(job, rank, EXIT_STORAGE)
    assert (
        "No space left on device" in job.errors()[0][1] and "free some space" in job.errors()[0][1]
    )
    # the step-2 checkpoint is the last whole one: nothing saved lost
    ckpt = tmp_path / "f" / "checkpoints"
    last = (
        load_checkpoint(ckpt / "latest.pt")
        if parallel == "ddp"
        else torch.load(ckpt / "latest.dcp" / "extra.pt", weights_only=False)
    )
    assert last["step"] == 2


@pytest.mark.slow
def test_rank_0_failing_to_rewrite_a_resumed_runs_files_stops_every_rank(tmp_path, tiny):
    """A corrupt meta.json on --resume (2-process FSDP resuming a one-process .pt run): rank 0 alone
    reads it; its error reaches every rank (128 s and a JSONDecodeError traceback, before the fixes
    of wave 3)."""
    assert train.main([*tiny, "--name", "m", "train.stop_at=2"]) == 0
    (tmp_path / "m" / "meta.json").write_text('{"git": {"commit": ')
    job = launch(
        2, ["--name", "m", "--resume", f"log.out_dir={tmp_path}", "train.parallel=fsdp"], tmp_path
    )
    _stopped_together(job, EXIT_BAD_INPUT, "meta.json cannot be read (JSONDecodeError")


@pytest.mark.slow
def test_a_rank_killed_mid_run_is_named_by_torchrun_and_the_survivors_stop(tmp_path, tiny):
    """kill -9 of rank 3 of dp2 x tp2 (4 processes): torchrun's report names it (its root cause:
    exit -9, SIGKILL), the other three stop within seconds with exit 5 and no line of their own (a
    ~15-line gloo 'Connection closed by peer' traceback on each, before); the start line counts data
    shares, not processes."""
    job = launch(
        4,
        [*tiny, "--name", "k", "train.parallel=tp", "train.tp_size=2"],
        tmp_path,
        env={"NORMLAB_KILL_AT": "step:2", "NORMLAB_FAULT_RANK": "3"},
    )
    _stopped_by_torchrun(job, 3, -9)
    assert job.errors() == [] and job.tracebacks() == [] and "Signal 9 (SIGKILL)" in job.report, (
        job.errs
    )
    assert "(2 data shares x 2 tensor parallel)" in job.outs[0]


# -- the job's layout is checked before anything divides, every rank sees one run directory --------
def test_tp_size_that_does_not_divide_the_processes_is_refused_before_anything_divides():
    """train.tp_size=4 on 2 processes: a ConfigError (one line, exit 2) before the data coordinates
    are computed (a ZeroDivisionError traceback before). In-process with the job's shape: the check
    precedes any collective, so no process group is needed; the 2-process path of the same check is
    the seq_len one below."""
    from training.distributed import Dist

    cfg = load_config(TINY, ["train.parallel=tp", "train.tp_size=4"])
    with pytest.raises(
        ConfigError, match=r"train.tp_size=4 must divide the number of processes \(2\)"
    ):
        train.train(cfg, False, "t", Dist(rank=0, world_size=2, local_world=2))


@pytest.mark.slow
def test_seq_len_that_tp_cannot_split_is_one_line(tmp_path, tiny):
    # SIGABRT before
    job = launch(2, [*tiny, "--name", "t", "train.parallel=tp", "train.seq_len=33"], tmp_path)
    _stopped_together(job, EXIT_BAD_INPUT, "train.seq_len divisible by train.tp_size=2")


@pytest.mark.slow
def test_ranks_that_do_not_share_the_run_directory_are_refused(tmp_path, tiny):
    """Two 'nodes' with a directory each (no shared file system): refused at start, naming the
    option, where it used to report ok and leave a DCP checkpoint in pieces."""
    job = launch(
        2,
        [*tiny, "--name", "n", "train.parallel=fsdp"],
        tmp_path,
        env={"NORMLAB_SHARED_WAIT_S": "0.5"},
        per_rank={1: [f"log.out_dir={tmp_path / 'node1'}"]},
    )
    _stopped_together(job, EXIT_BAD_INPUT, "rank 1 does not see the run directory rank 0 writes (")
    assert "file system every node shares" in job.errors()[0][1]
    assert not (tmp_path / "n" / "checkpoints").exists() and not list(tmp_path.glob(".n.shared-*"))


def test_layout_checks_name_the_option_and_a_value_that_works():
    from training.parallel import check_layout

    args = load_config(TINY).model
    with pytest.raises(
        ValueError,
        match=r"train.tp_size=3 must divide the number of processes \(4\), e.g. "
        r"train.tp_size=2",
    ):
        check_layout("tp", 4, 3, args, 32)
    with pytest.raises(ValueError, match=r"got 33: e.g. train.seq_len=32"):
        check_layout("tp", 2, 2, args, 33)
    with pytest.raises(ValueError, match=r"train.parallel=tp shards the model over torchrun's"):
        check_layout("tp", 1, 4, args, 33)  # one process: refused, not trained unsharded in silence
    check_layout("ddp", 1, 4, args, 33)
    check_layout("fsdp", 2, 4, args, 33)
    with pytest.raises(
        ConfigError, match=r"train.batch_size=8 must split evenly into the 3 data-parallel shares"
    ):
        split_batch(load_config(TINY).train, 3)
    with pytest.raises(
        ConfigError,
        match=r"train.micro_batch_size=4 must divide each data-parallel share of "
        r"train.batch_size=12 \(6 sequences on each of 2 shares\)",
    ):
        split_batch(load_config(TINY, ["train.micro_batch_size=4", "train.batch_size=12"]).train, 2)


def test_sharding_asked_of_one_process_is_refused_in_one_line(tmp_path, data_args, capsys):
    """train.parallel=tp or fsdp without torchrun: one line, exit 2, nothing written (it trained the
    whole model in one process and said nothing, issue 42)."""
    for how in ("tp", "fsdp"):
        args = [
            "--config",
            TINY,
            f"log.out_dir={tmp_path / 'runs'}",
            *data_args,
            f"train.parallel={how}",
        ]
        assert train.main([*args, "train.tp_size=4"]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"train.parallel={how} shards the model" in err[0], err
        assert "torchrun --nproc_per_node" in err[0] and "train.parallel=ddp" in err[0]
    assert not (tmp_path / "runs").exists()


# -- too big for the machine: refused before it starts ---------------------------------------------
def test_memory_check_refuses_with_the_largest_that_fits(tmp_path, data_args, capsys, monkeypatch):
    from training import memory

    monkeypatch.setattr(
        memory, "available", lambda: (2.0 * memory.GiB, "MemAvailable in /proc/meminfo")
    )
    cfg = load_config(TINY, ["train.seq_len=100000"])
    with pytest.raises(ConfigError) as e:
        memory.check(cfg, 1, 1, 8, 1, torch.device("cpu"))
    line = str(e.value)
    assert "more memory per process" in line and "2.0 GiB is available (MemAvailable" in line
    fits = int(line.split("train.seq_len=")[1].split()[0])
    assert (
        1000 < fits < 100000
        and "train.micro_batch_size=" in line
        and "train.memory_check=false" in line
    )
    est = lambda s, m: memory.estimate(cfg, 1, 1, m, seq_len=s).total  # noqa: E731
    assert est(fits, 8) <= 2.0 * memory.GiB < est(fits + 1, 8)
    # two processes on this machine share it: each gets half
    with pytest.raises(ConfigError, match="for each of the 2 processes on this machine"):
        memory.check(
            load_config(TINY, [f"train.seq_len={fits}", "train.batch_size=16"]),
            2,
            2,
            8,
            2,
            torch.device("cpu"),
        )
    # through train.py: one line, nothing written; train.memory_check=false lets it through to the
    # next check
    assert (
        train.main(
            [
                "--config",
                TINY,
                f"log.out_dir={tmp_path / 'runs'}",
                *data_args,
                "train.seq_len=100000",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "more memory per process" in err[0] and not (tmp_path / "runs").exists()
    )
    assert (
        train.main(
            [
                "--config",
                TINY,
                f"log.out_dir={tmp_path / 'runs'}",
                *data_args,
                "train.seq_len=100000",
                "train.memory_check=false",
            ]
        )
        == 2
    )
    assert "too few for" in capsys.readouterr().err  # the corpus' splits are shorter than that


# -- nothing saved is skipped: the newest readable checkpoint of either kind -----------------------
def _to_dcp(pt: Path, dcp: Path) -> None:
    """A .pt checkpoint's full state rewritten as a one-process DCP directory."""
    from model import Llama
    from training.optim import build_optimizer

    cfg = load_config(pt.parent.parent / "config.yaml")
    state = load_checkpoint(pt)
    model = Llama(cfg.model)
    opt = build_optimizer(model, cfg.optim)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    save_sharded(
        dcp, model, opt, {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    )


@pytest.mark.slow
def test_an_unreadable_latest_pt_never_skips_a_newer_readable_dcp(tmp_path, tiny, capsys):
    """.pt to step 2 and 4, a sharded session to 6 (latest.dcp), .pt to 8 (latest.pt; previous.pt
    holds 4), then latest.pt truncated: --resume continues from latest.dcp (6), not previous.pt (4),
    and the curve is the uninterrupted run's. (Before, DCP checkpoints older than latest.pt were
    dropped even when it was unreadable.)"""
    assert train.main([*tiny, "--name", "ref", "train.steps=10"]) == 0
    assert train.main([*tiny, "--name", "r", "train.steps=10", "train.stop_at=4"]) == 0
    # the same run to step 6 elsewhere, its checkpoint made a DCP directory of run r
    side = tmp_path / "side"
    import shutil

    shutil.copytree(tmp_path / "r", side)
    assert (
        train.main(["--name", "side", "--resume", f"log.out_dir={tmp_path}", "train.stop_at=6"])
        == 0
    )
    _to_dcp(side / "checkpoints" / "latest.pt", tmp_path / "r" / "checkpoints" / "latest.dcp")
    # what that session logged
    shutil.copy(side / "metrics.jsonl", tmp_path / "r" / "metrics.jsonl")
    assert (
        train.main(["--name", "r", "--resume", f"log.out_dir={tmp_path}", "train.stop_at=8"]) == 0
    )
    ckpt = tmp_path / "r" / "checkpoints"
    assert (
        load_checkpoint(ckpt / "latest.pt")["step"] == 8
        and load_checkpoint(ckpt / "previous.pt")["step"] == 4
    )
    data = (ckpt / "latest.pt").read_bytes()
    (ckpt / "latest.pt").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert (
        train.main(["--name", "r", "--resume", f"log.out_dir={tmp_path}", "train.stop_at=0"]) == 0
    )
    err = capsys.readouterr().err
    assert (
        "cannot read checkpoint" in err
        and "latest.pt" in err
        and "resuming from latest.dcp (step 6)" in err
    )
    curve = lambda d: [
        (r["step"], r.get("train/loss"), r.get("val/loss"))
        for r in read_metrics(d / "metrics.jsonl")
    ]  # noqa: E731
    assert curve(tmp_path / "r") == curve(tmp_path / "ref")


@pytest.mark.slow
def test_damaged_dcp_checkpoints_are_one_line_each_without_dcp_tracebacks(tmp_path, tiny, capsys):
    """A deleted .metadata: the fallback is one line (DCP logged ~80 lines of tracebacks first);
    both DCP copies truncated: one line naming each with a reason (it said 'EOFError: ' and left
    previous.dcp out)."""
    assert train.main([*tiny, "--name", "d", "train.stop_at=4"]) == 0
    ckpt = tmp_path / "d" / "checkpoints"
    _to_dcp(ckpt / "previous.pt", ckpt / "previous.dcp")
    _to_dcp(ckpt / "latest.pt", ckpt / "latest.dcp")
    for pt in ckpt.glob("*.pt"):
        pt.unlink()
    (ckpt / "latest.dcp" / ".metadata").unlink()
    capsys.readouterr()
    assert (
        train.main(["--name", "d", "--resume", f"log.out_dir={tmp_path}", "train.stop_at=0"]) == 0
    )
    err = capsys.readouterr().err
    assert "latest.dcp cannot be read" in err and "resuming from previous.dcp (step 2)" in err
    assert "Traceback" not in err and "Global metadata" not in err
    for pt in ckpt.glob("*.pt"):  # what that resume wrote: one process writes .pt files
        pt.unlink()
    for shard in ckpt.glob("*.dcp/*.distcp"):
        shard.write_bytes(b"")
    assert train.main(["--name", "d", "--resume", f"log.out_dir={tmp_path}", "train.steps=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "latest.dcp cannot be read" in err[0]
        and "previous.dcp cannot be read" in err[0]
    ), err
    assert "EOFError: \n" not in err[0] + "\n" and "Traceback" not in err[0]


# -- smaller: what a relaunch, a failed write and the run's files say ------------------------------
@pytest.mark.slow
def test_resuming_a_diverged_run_exits_3_again(tmp_path, tiny, capsys):
    args = ["optim.lr=1e4", "optim.grad_clip=0", "optim.warmup_steps=0", "train.steps=30"]
    assert train.main([*tiny, "--name", "boom", *args]) == EXIT_DIVERGED
    capsys.readouterr()
    assert (
        train.main(["--name", "boom", "--resume", f"log.out_dir={tmp_path}", "train.steps=60"]) == 3
    )
    assert "diverged at step" in capsys.readouterr().out


@pytest.mark.slow
def test_an_extended_run_is_not_finished_until_it_ends_and_its_logger_closes(
    tmp_path, tiny, monkeypatch
):
    """Extending a finished run removes its old 'finished' summary at the resume (a reader would
    take the run for done); a failure of the first eval still closes the logger (its progress bar
    and files)."""
    assert train.main([*tiny, "--name", "x"]) == 0
    assert json.loads((tmp_path / "x" / "summary.json").read_text())["steps"] == 6

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(train, "train_step", full)
    assert train.main(["--name", "x", "--resume", f"log.out_dir={tmp_path}", "train.steps=12"]) == 4
    assert not (tmp_path / "x" / "summary.json").exists()
    closed = []
    monkeypatch.setattr(train.Logger, "close", lambda self, summary=None: closed.append(True))
    monkeypatch.setattr(train, "evaluate", full)
    assert train.main([*tiny, "--name", "y"]) == 4 and closed


def test_storage_lines_promise_resume_only_when_it_can_work_and_files_are_fsynced(
    tmp_path, monkeypatch
):
    read_only = storage_line(OSError(errno.EROFS, "Read-only file system", "runs/x/metrics.jsonl"))
    assert "make the run directory writable, then --resume continues" in read_only
    full = storage_line(OSError(errno.ENOSPC, "No space left on device"))
    assert "free some space, then --resume" in full
    from training import rundir

    synced = []
    real = os.fsync
    monkeypatch.setattr(rundir.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    rundir.write_json(tmp_path / "summary.json", {"status": "ok"})
    assert len(synced) == 2  # the file before its rename, the directory after
