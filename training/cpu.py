"""CPU process settings: thread count and the allocator (step time only) and denormal flushing, which changes
results too: every float32 below 2^-126 (~1.2e-38) becomes 0 (1e-39 reads back as 0.0), in the forward, the
backward and the optimizer. train.py records it in meta.json (`cpu.flush_denormal`)."""

from __future__ import annotations

import ctypes
import ctypes.util

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_KEEP_BYTES = 1 << 30


def tune_cpu(threads: int = 0, malloc: bool = True) -> dict:
    """Apply the CPU settings train.py uses; return them for meta.json (flush_denormal, allocator).

    - flush denormal floats: post-norm runs make tiny values that otherwise slow steps several-fold. This is a
      numerical choice, not just a speed one (tiny values become exactly 0); GPUs' fast paths do the same;
    - glibc malloc: serve large tensors from the heap instead of fresh mmap()s and keep freed memory
      (mmap / trim thresholds 1 GiB). Otherwise every activation of a step page-faults anew; measured
      by scripts/bench_norms.py and scripts/bench_train.py (about 3x on norm kernels here).
    """
    torch.set_flush_denormal(True)
    if threads:
        torch.set_num_threads(threads)
    return {"flush_denormal": True, "allocator": _tune_malloc() if malloc else "glibc default"}


def _tune_malloc() -> str:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        ok = False
    return "glibc mallopt mmap/trim threshold 1 GiB" if ok else "system default (mallopt unavailable)"


# the instruction sets that change which kernels run (torch's dispatch, oneDNN/MKL, normlab's native build)
_ISA = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16",
        "asimd", "sve")


# the environment that changes which instructions torch's and normlab's kernels use: a saved benchmark names them
ISA_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "NORMLAB_PORTABLE")


def machine() -> str:
    """The machine a benchmark ran on, for the header of its saved table: CPU model, cores, the instruction sets
    that select kernels, torch's threads and version (speed ratios depend on all of them)."""
    import os
    from pathlib import Path

    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and model == "unknown CPU":
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = " ".join(f for f in _ISA if f in flags) or "unknown"
    return (f"{model}, {os.cpu_count()} cores, ISA: {isa}; {torch.get_num_threads()} torch threads, torch "
            f"{torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}")


class SavedOutput:
    """Print to the terminal and, with a path, also keep what was printed and write it to that file at the end
    (whole, atomically: an interrupted benchmark leaves no half-written table), under a header naming the
    command and the machine."""

    def __init__(self, path, command: str):
        import io
        import sys

        self.path, self.command, self.buffer, self.stdout = path, command, io.StringIO(), sys.stdout

    def write(self, text: str) -> int:
        self.buffer.write(text)
        return self.stdout.write(text)

    def flush(self) -> None:
        self.stdout.flush()

    def __enter__(self):
        import sys

        sys.stdout = self
        return self

    def __exit__(self, kind, *_) -> None:
        import datetime
        import os
        import sys
        from pathlib import Path

        sys.stdout = self.stdout
        if self.path is None or kind is not None:
            return
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        env = " ".join(f"{k}={os.environ[k]}" for k in ISA_ENV if os.environ.get(k))  # as it was run
        header = (f"`{env + ' ' if env else ''}{self.command}` on {datetime.date.today().isoformat()}\n\n"
                  f"Machine: {machine()}\n")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(header + self.buffer.getvalue())
        os.replace(tmp, path)
