"""What the benchmark scripts share: a saved benchmark's header (the command, the instruction-set
environment it ran under, the machine) and the output that is printed and saved whole. The
benchmarks run from the checkout as modules (`python -m bench.bench_norms`) and import it as
`bench.benchlib`."""

from __future__ import annotations

import datetime
import io
import os
import sys
from pathlib import Path

import torch

from training.rundir import write_text

# the instruction sets that change which kernels run (torch's dispatch, oneDNN/MKL, normlab's native
# build)
_ISA = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "sve",
)

# the environment that changes which instructions torch's and normlab's kernels use: a saved
# benchmark names them
ISA_ENV = (
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "NORMLAB_PORTABLE",
)


def machine() -> str:
    """The machine a benchmark ran on, for the header of its saved table: CPU model, cores, the
    instruction sets that select kernels, torch's threads and version (speed ratios depend on all of
    them)."""
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
    return (
        f"{model}, {os.cpu_count()} cores, ISA: {isa}; {torch.get_num_threads()} torch threads, "
        "torch "
        f"{torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}"
    )


class SavedOutput:
    """Print to the terminal and, with a path, also keep what was printed and write it to that file
    at the end (whole, atomically: an interrupted benchmark leaves no half-written table), under a
    header naming the command and the machine."""

    def __init__(self, path, command: str):
        self.path, self.command, self.buffer, self.stdout = path, command, io.StringIO(), sys.stdout

    def write(self, text: str) -> int:
        self.buffer.write(text)
        return self.stdout.write(text)

    def flush(self) -> None:
        self.stdout.flush()

    def isatty(self) -> bool:
        return self.stdout.isatty()

    def __enter__(self):
        sys.stdout = self
        return self

    def __exit__(self, kind, *_) -> None:
        sys.stdout = self.stdout
        if self.path is None or kind is not None:
            return
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # as it was run
        env = " ".join(f"{k}={os.environ[k]}" for k in ISA_ENV if os.environ.get(k))
        header = (
            f"`{env + ' ' if env else ''}{self.command}` on {datetime.date.today().isoformat()}\n\n"
            f"Machine: {machine()}\n"
        )
        write_text(path, header + self.buffer.getvalue())


def gpu_parser(doc: str):
    """A GPU check's argument parser: the script's docstring as its help, and --dry-run (the same
    code path on CPU at tiny sizes, which the tests run)."""
    import argparse

    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny sizes: checks the code path in seconds"
    )
    return p


def gpu_device(dry_run: bool) -> torch.device | None:
    """cuda, or cpu for a dry run; None (after one line on stderr) without a GPU or --dry-run."""
    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print(
            "error: no CUDA device; run with --dry-run to check the code path on CPU",
            file=sys.stderr,
        )
        return None
    return torch.device("cuda")
