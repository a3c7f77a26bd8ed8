"""Fault injection for the kill -9 tests: with NORMLAB_KILL_AT=<point>:<n> set, the process kills itself with
SIGKILL the n-th time it reaches point(<point>); NORMLAB_KILL_AT=<point>:<n>:enospc raises the OSError a full disk
raises there instead (every process of a torchrun job reaches the same points). Unset (always, outside those
tests), point() is a dict lookup.

Points: start (run directory chosen, nothing written), config (config.yaml written, meta.json not yet),
step (after an optimizer step, before its metrics are logged), log (after a metrics record), eval (inside an
evaluation), checkpoint (the new checkpoint written to its temp file, not yet renamed), checkpoint_swap
(latest.pt moved to previous.pt, the new one not yet in place), summary (before summary.json).
"""

from __future__ import annotations

import errno
import os
import signal
from collections import Counter

_counts: Counter = Counter()


def reset() -> None:
    """Forget the counts (a new run in the same process: train.py --serve)."""
    _counts.clear()


def point(name: str) -> None:
    target = os.environ.get("NORMLAB_KILL_AT")
    if not target:
        return
    where, _, rest = target.partition(":")
    nth, _, action = rest.partition(":")
    if where == name:
        _counts[name] += 1
        if _counts[name] == int(nth or 1):
            if action == "enospc":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"(injected at {name})")
            os.kill(os.getpid(), signal.SIGKILL)
