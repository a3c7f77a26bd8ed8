"""CPU process settings that change step time, not results: thread count, denormal flushing, allocator."""

from __future__ import annotations

import ctypes
import ctypes.util

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_KEEP_BYTES = 1 << 30


def tune_cpu(threads: int = 0, malloc: bool = True) -> str:
    """Apply the CPU settings train.py uses; return a description of the allocator setting.

    - flush denormal floats: post-norm runs make tiny values that otherwise slow steps several-fold;
    - glibc malloc: serve large tensors from the heap instead of fresh mmap()s and keep freed memory
      (mmap / trim thresholds 1 GiB). Otherwise every activation of a step page-faults anew; measured
      by scripts/bench_norms.py and scripts/bench_train.py (about 3x on norm kernels here).
    """
    torch.set_flush_denormal(True)
    if threads:
        torch.set_num_threads(threads)
    if not malloc:
        return "glibc default"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        ok = False
    return "glibc mallopt mmap/trim threshold 1 GiB" if ok else "system default (mallopt unavailable)"
