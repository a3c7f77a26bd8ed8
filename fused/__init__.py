"""normlab's fused CPU kernels (C++, built on first use with torch.utils.cpp_extension, cached by torch
under ~/.cache/torch_extensions, one build per CPU instruction set): the norms (norms_cpu.cpp with their
autograd, row loops in norms_kernel.h compiled per instruction set by norms_isa_*.cpp; called from fused/norms.py)
and the cross-entropy and SwiGLU (cross_entropy_cpu.cpp, swiglu_cpu.cpp, fused/ops.py).
All register ops under torch.ops.normlab. The package knows nothing of the model: model/ calls it with
tensors, and it sits below model/ in the import order (it imports only torch).

Where no compiler exists the build fails once, with a warning, and every fast path runs its reference.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path

import torch

SOURCES = [Path(__file__).parent / f"{name}.cpp"
           for name in ("norms_cpu", "norms_isa_base", "norms_isa_avx2", "norms_isa_avx512", "cross_entropy_cpu",
                        "swiglu_cpu")]
_loaded: bool | None = None  # None: not tried yet
_built: dict = {}  # how the loaded build was made (for meta.json)


def cpu_features() -> str | None:
    """The CPU's instruction-set flags (Linux /proc/cpuinfo), or None where they cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):  # x86 / Arm
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return None


def build_target(features: str | None, portable: bool) -> tuple[str, list[str]]:
    """(extension name, arch flags). -march=native code only runs on CPUs with the same instructions, and torch
    caches a build by name (under ~/.cache/torch_extensions, often a home directory shared across a cluster's
    nodes): a native build is named after a hash of the CPU's flags, so a node with other flags builds its own.
    Where the flags cannot be read, or NORMLAB_PORTABLE is set, the build is portable."""
    if portable or not features:
        return "normlab_kernels_portable", []
    tag = hashlib.sha256(f"{platform.machine()} {features}".encode()).hexdigest()[:12]
    return f"normlab_kernels_native_{tag}", ["-march=native"]


@torch.compiler.assume_constant_result  # torch.compile calls it while tracing: no graph break at a first build
def kernel_available() -> bool:
    """Build (or load the cached build of) the CPU kernels once per process; False if that fails."""
    global _loaded
    if _loaded is None:
        if os.environ.get("RANK", "0") == "0":  # once per job, not once per torchrun process
            print("[normlab] loading the fused CPU kernels (compiled on first use, about a minute; then cached)",
                  file=sys.stderr, flush=True)
        name, arch = build_target(cpu_features(), bool(os.environ.get("NORMLAB_PORTABLE")))
        cflags = ["-O3", "-fopenmp"] + arch  # -fopenmp: at::parallel_for is an inline OpenMP loop
        if arch:  # one copy of the norms' loops, for this CPU; the portable build has one per instruction set
            cflags.append("-DNORMLAB_NATIVE")
        attempts = [(cflags, ["-fopenmp"])]
        if sys.platform.startswith("linux"):  # first with glibc's vector exp (libmvec), then without
            attempts.insert(0, (cflags + ["-DNORMLAB_LIBMVEC"], ["-fopenmp", "-lmvec"]))
        for extra_cflags, extra_ldflags in attempts:
            try:
                _build(name, extra_cflags, extra_ldflags)
                _loaded = True
                _built.update(name=name, cflags=extra_cflags, norm_loops=torch.ops.normlab.norm_loops())
                break
            except Exception as e:  # no compiler, no headers...: stay correct, just slower
                error = e
        else:
            warnings.warn(f"normlab: fused CPU kernels unavailable, using the reference paths ({error})",
                          stacklevel=2)
            _loaded = False
            _built.update(error=str(error).strip().splitlines()[0][:200] if str(error) else repr(error))
    return _loaded


def kernel_paths(device: str, norm_impl: str, ops_impl: str) -> dict:
    """Which implementation each op of a model runs on `device` ('cpu', 'cuda', ...), for meta.json: the
    fused path, or the reference and why (a fast path that falls back says so instead of doing it silently)."""
    def fast(what: str) -> str:
        if device == "cpu":
            return "fused CPU kernel" if kernel_available() else f"reference (kernel build failed: {_built['error']})"
        if device == "cuda" and what == "norm":
            return "torch's fused F.rms_norm / F.layer_norm in float32"
        return f"reference (no fused {what} kernel on {device})"

    paths = {"norm": fast("norm") if norm_impl == "fast" else "reference",
             "cross_entropy": fast("cross_entropy") if ops_impl == "fast" else "reference",
             "swiglu": fast("swiglu") if ops_impl == "fast" else "reference"}
    if _loaded:
        paths["build"] = dict(_built)
    return paths


def _build(name: str, extra_cflags: list[str], extra_ldflags: list[str]) -> None:
    """torch's load(), under an OS file lock. load() holds torch's own build lock (a plain `lock` file in the
    build directory) while ninja checks or builds, in every process that loads; a process killed in that window
    (kill -9, a scheduler's preemption, a test's timeout) leaves the file behind, and every later process waits
    for it forever. An OS lock dies with its holder: holding it, no other normlab process is inside load(), so a
    `lock` file found then is stale and is removed."""
    from filelock import FileLock
    from torch.utils.cpp_extension import _get_build_directory, load

    build_dir = Path(_get_build_directory(name, False))
    build_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(build_dir / "normlab.flock")):
        (build_dir / "lock").unlink(missing_ok=True)  # torch's, left by a killed process (none is building now)
        load(name=name, sources=[str(s) for s in SOURCES], extra_cflags=extra_cflags,
             extra_ldflags=extra_ldflags, extra_include_paths=[str(Path(__file__).parent)], is_python_module=False,
             build_directory=str(build_dir), verbose=False)
    _register_fake()


def _register_fake() -> None:
    """Shape-only versions of the ops so torch.compile can trace through them."""

    @torch.library.register_fake("normlab::norm")
    def _(x, d, weight, bias, eps, center):
        dtype = torch.promote_types(x.dtype, weight.dtype) if weight is not None else x.dtype
        return x.new_empty(x.shape, dtype=dtype)

    @torch.library.register_fake("normlab::norm_fwd")
    def _(x, weight, bias, eps, center):
        dtype = torch.promote_types(x.dtype, weight.dtype) if weight is not None else x.dtype
        rows = x.new_empty(x.shape[0], dtype=torch.promote_types(x.dtype, torch.float32))
        return x.new_empty(x.shape, dtype=dtype), rows, rows.new_empty(x.shape[0])

    @torch.library.register_fake("normlab::norm_bwd")
    def _(grad, x, weight, rstd, mean, center, has_bias):
        dw = weight.new_empty(weight.shape) if weight is not None else None
        db = weight.new_empty(weight.shape) if weight is not None and has_bias else None
        return x.new_empty(x.shape), dw, db

    @torch.library.register_fake("normlab::cross_entropy_fwd")
    def _(logits, target, ignore_index):
        rows = logits.new_empty(logits.shape[0], dtype=torch.promote_types(logits.dtype, torch.float32))
        return rows, rows.new_empty(logits.shape[0])

    @torch.library.register_fake("normlab::cross_entropy_bwd")
    def _(grad_scale, logits, target, lse, ignore_index):
        return logits.new_empty(logits.shape)

    @torch.library.register_fake("normlab::swiglu_fwd")
    def _(a, b):
        return a.new_empty(a.shape)

    @torch.library.register_fake("normlab::swiglu_bwd")
    def _(grad, a, b):
        return a.new_empty(a.shape), b.new_empty(b.shape)
