"""How a run ends: its exit code and one line (docs/usage.md's table), how its process leaves."""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
import traceback

import torch.distributed as dist

from data.sources import DataError
from training.checkpoint import CheckpointError
from training.config import ConfigError
from training.distributed import Dist, exit_now, is_shared, looks_like_lost_contact
from training.errors import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PEER,
    EXIT_STORAGE,
    path_error,
    path_line,
    storage_fault,
)
from training.rundir import RunDir

# the codes (training/errors.py, every tool's): 0 finished (any status but diverged), stopped at
# train.stop_at, or already finished; 2 config, command line, data, checkpoint, a path in the way,
# too big a run: nothing written; 3 diverged, a result; 4 the OS could not store the run's files
# (every file is the old or the new one); 5 another process of the job failed first: --resume; 130
# Ctrl-C / SIGTERM: --resume
AGENT_WAIT_S = 1.0  # a peer left: how long to wait for torchrun's SIGTERM (see leave)


def status_code(status: str, planned_stop: bool = False) -> int:
    """The exit code of a run that ended with `status` (stopped at train.stop_at: 0, not 130)."""
    if status == "diverged":
        return EXIT_DIVERGED
    return EXIT_INTERRUPTED if status == "interrupted" and not planned_stop else EXIT_OK


def result_line(status: str, s: dict, path) -> str:
    """A finished run's last line: its status, final val loss, the unigram level, its speed."""
    final, dead = s["final_val_loss"], s["dead_gradients_at"]
    dead_line = f" dead gradients (every gradient below the final norm 0 from step {dead});"
    why = "" if dead is None else dead_line
    return (
        f"{status}:{why} final val loss {'-' if final is None else f'{final:.4f}'} "
        f"(unigram entropy {s['unigram_entropy']:.3f}), {s['tokens_per_s'] or 0:,.0f} "
        f"tokens/s -> {path}"
    )


def finished(run: RunDir, say: bool) -> int:
    """A relaunch of a finished run: it says so (rank 0), nothing to do; the code it ended with."""
    status = run.status()
    if say and status == "diverged":  # a result, not a state to continue from
        at = (run.read_summary() or {}).get("diverged_at")
        print(
            f"run {run.path} diverged at step {at} (a result: it cannot be trained further); "
            f"nothing to do"
        )
    elif say:
        print(
            f"run {run.path} already finished ({status}); nothing to do (pass train.steps=N to "
            f"train further)"
        )
    return status_code(status)


def outcome(e: BaseException, d: Dist) -> tuple[int, str]:
    """(exit code, the one line) of an error that ended the run; a bug's traceback printed here."""
    if isinstance(e, (ConfigError, DataError, CheckpointError)):
        return EXIT_BAD_INPUT, named(f"error: {e}", e, d)
    if isinstance(e, KeyboardInterrupt):  # before the loop (e.g. preparing data): nothing to save
        return EXIT_INTERRUPTED, "interrupted" if d.is_master else ""  # Ctrl-C reaches every rank
    if (
        isinstance(e, MemoryError)
        or "can't allocate memory" in str(e)
        or type(e).__name__ == "OutOfMemoryError"
    ):
        line = (
            f"error: out of memory: {one_line(e)}; the run is too big for this machine: lower "
            f"train.micro_batch_size or train.seq_len (the last checkpoint is intact)"
        )
        return EXIT_BAD_INPUT, named(line, e, d)
    if d.world_size > 1 and looks_like_lost_contact(e):  # a peer left first: it (or torchrun) said
        return EXIT_PEER, ""
    err = storage_fault(e)
    if err is not None:  # a full disk, a read-only or failing file system: writes are atomic
        return EXIT_STORAGE, named(storage_line(err), e, d)
    err = path_error(e)
    if err is not None:  # a file where the run's folder goes, no permission: the input's fault
        line = path_line(err).replace("error: ", "error: cannot write the run's files: ", 1)
        return EXIT_BAD_INPUT, named(f"{line}; choose another log.out_dir", e, d)
    if not is_shared(e) or d.is_master:
        traceback.print_exception(e)
    where = "" if d.world_size == 1 else f", rank {d.rank}"
    return 1, f"error: {one_line(e)} (the traceback above{where})"


def cannot_join(e: Exception) -> tuple[int, str]:
    """(exit code, line) when this process cannot join the job's process group (rank 0 says it)."""
    line = (
        f"error: cannot join the job's other processes: {one_line(e)} (another job on the same "
        f"port? torchrun --standalone, or a --master_port of its own, keeps jobs apart)"
    )
    return EXIT_PEER, line if os.environ.get("RANK", "0") == "0" else ""


def named(line: str, e: BaseException, d: Dist) -> str:
    """The line with the rank it happened on, when that rank alone had it and is not rank 0."""
    if d.rank == 0 or is_shared(e):
        return line
    return line.replace("error: ", f"error: rank {d.rank}: ", 1)


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def storage_line(e: OSError) -> str:
    """What a failed write means: writes are atomic, so no file is half-written; how to go on."""
    head = f"error: cannot write the run's files: {e}"
    go_on = "--resume continues from the last checkpoint (or starts the run if none was written)"
    if e.errno == errno.EROFS:
        return f"{head}; make the run directory writable, then {go_on}; or use another log.out_dir"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{head}; free some space, then {go_on}"
    return f"{head}; {go_on}"


def leave(d: Dist, code: int, line: str = "", error: BaseException | None = None) -> int:
    """Print the line and end with the code: returned in one process; several leave with exit_now.

    A finished run or a shared error: rank 0 prints, the ranks meet at a barrier, then all exit. A
    rank's own error: it prints and exits at once; torchrun stops the others. A peer gone: nothing
    to print (it did, or torchrun's report names it); under torchrun wait for its SIGTERM, so that
    the report's root cause is the rank that failed first, not this one."""
    if d.world_size == 1 or not dist.is_initialized():
        if line:
            print(line, file=sys.stderr, flush=True)
        return code
    signal.set_wakeup_fd(-1)  # a stop request's thread no longer sees signals
    for s in (signal.SIGINT, signal.SIGTERM):  # torchrun stops the others once one exits: say it
        signal.signal(s, signal.SIG_IGN)
    if line and (d.is_master or error is not None and not is_shared(error)):
        print(line, file=sys.stderr, flush=True)
    if error is None or is_shared(error):
        try:
            dist.barrier()
        except Exception:  # a peer died meanwhile: the launcher names it
            code = EXIT_PEER
    elif (
        code == EXIT_PEER
        and not line
        and os.environ.get("TORCHELASTIC_RUN_ID")
        and not getattr(error, "after_signal", False)
    ):
        signal.signal(signal.SIGTERM, lambda *_: exit_now(EXIT_PEER))
        time.sleep(AGENT_WAIT_S)
    exit_now(code)
