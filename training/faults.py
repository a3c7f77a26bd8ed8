"""Fault injection for the fault tests: with NORMLAB_KILL_AT=<point>:<n> set, the process kills
itself with SIGKILL the n-th time it reaches point(<point>); <point>:<n>:enospc raises the OSError a
full disk raises there instead, <point>:<n>:crash a RuntimeError (a bug), and <point>:<n>:stall runs
one torch op of tens of seconds (a long step: Python's signal handlers wait for it to return),
<point>:<n>:hang a step of ten minutes, <point>:<n>:usr2 the preemption notice a scheduler sends
(submitit's SIGUSR2); with NORMLAB_FAULT_ONCE=<file> the fault fires in the first process that
reaches it only (a requeued run goes on). Every
process of a torchrun job reaches the same points unless NORMLAB_FAULT_RANK=<r> names the one rank
the fault fires on (what happens on one rank alone: its disk, its OOM kill, its bug). Unset (always,
outside those tests), point() is a dict lookup.

Points: start (run directory chosen, nothing written), config (config.yaml written, meta.json not
yet), resume (rank 0: a resumed run's checkpoint loaded, its config and meta.json about to be
rewritten), step (after an optimizer step, before its metrics are logged), log (after a metrics
record), eval (inside an evaluation), checkpoint (the new checkpoint written to its temp file, not
yet renamed), checkpoint_swap (latest.pt moved to previous.pt, the new one not yet in place),
summary (before summary.json), write (any file written whole by training/rundir.py's replacing:
complete beside its target, not yet renamed onto it). Rank 0 alone reaches config, resume, and a .pt
checkpoint's checkpoint and checkpoint_swap; a sharded run's checkpoint point is every rank's."""

from __future__ import annotations

import errno
import os
import signal
from collections import Counter

_counts: Counter = Counter()


def reset() -> None:
    """Forget the counts (a new run in the same process: lab/worker.py)."""
    _counts.clear()


def point(name: str) -> None:
    target = os.environ.get("NORMLAB_KILL_AT")
    if not target:
        return
    where, _, rest = target.partition(":")
    nth, _, action = rest.partition(":")
    rank = os.environ.get("NORMLAB_FAULT_RANK")
    if where != name or rank is not None and rank != os.environ.get("RANK", "0"):
        return
    _counts[name] += 1
    if _counts[name] == int(nth or 1):
        once = os.environ.get("NORMLAB_FAULT_ONCE")  # a file: the fault fires in one process only
        if once:
            if os.path.exists(once):
                return
            open(once, "w").close()
        if action == "usr2":  # what a scheduler's preemption notice is (submitit's signal)
            os.kill(os.getpid(), signal.SIGUSR2)
            return
        if action == "enospc":
            # as a full disk's write() raises it: no file named (the writer names its target)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if action == "crash":
            raise RuntimeError(f"injected crash at {name}")
        if action == "hang":  # a step of ten minutes
            import time

            time.sleep(600)
            return
        if action == "stall":  # 60 squarings of a 3000 x 3000 matrix, in one call
            import torch

            torch.ones(3000, 3000).matrix_power(2**60)
            return
        os.kill(os.getpid(), signal.SIGKILL)
