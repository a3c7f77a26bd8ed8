"""CPU process settings: thread count and the allocator (step time only) and denormal flushing,
which changes results too: every float32 below 2^-126 (~1.2e-38) becomes 0 (1e-39 reads back as
0.0), in the forward, the backward and the optimizer. train.py records it in meta.json
(`cpu.flush_denormal`)."""

from __future__ import annotations

import ctypes
import ctypes.util

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_KEEP_BYTES = 1 << 30


def tune_cpu(threads: int = 0, malloc: bool = True) -> dict:
    """Apply the CPU settings train.py uses; return them for meta.json (flush_denormal, allocator).

    - flush denormal floats: post-norm runs make tiny values that otherwise slow steps several-fold.
      This is a numerical choice, not just a speed one (tiny values become exactly 0); GPUs' fast
      paths do the same;
    - glibc malloc: serve large tensors from the heap instead of fresh mmap()s and keep freed memory
      (mmap / trim thresholds 1 GiB). Otherwise every activation of a step page-faults anew;
      measured by bench/bench_norms.py and bench/bench_train.py (about 3x on norm kernels here).
    """
    torch.set_flush_denormal(True)
    cores, load = _free_cores()
    n = choose_threads(threads, torch.get_num_threads(), cores, load)
    torch.set_num_threads(n)
    why = f"train.threads={threads}" if threads > 0 else f"auto: {cores} cores, load {load:.1f}"
    return {
        "flush_denormal": True,
        "allocator": _tune_malloc() if malloc else "glibc default",
        "threads": n,
        "threads_why": why,
    }


def choose_threads(requested: int, default: int, cores: int, load: float) -> int:
    """The torch threads of a run: `requested` where set (train.threads > 0), else torch's default
    capped at the cores other processes leave free (cores - load, at least 1): an OpenMP thread
    that shares a core with a busy process makes every barrier wait (a step ~20x slower)."""
    if requested > 0:
        return requested
    free = max(1, cores - round(load))
    return max(1, min(default, free))


def _free_cores() -> tuple[int, float]:
    """(cores this process may run on, the 1-minute load average: the other runnable processes)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return cores or 1, load


def _tune_malloc() -> str:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) and libc.mallopt(
            _M_TRIM_THRESHOLD, _KEEP_BYTES
        )
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        ok = False
    return (
        "glibc mallopt mmap/trim threshold 1 GiB" if ok else "system default (mallopt unavailable)"
    )
