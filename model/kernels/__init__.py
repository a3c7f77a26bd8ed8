"""normlab's fused CPU kernels (C++, built on first use with torch.utils.cpp_extension, cached by torch
under ~/.cache/torch_extensions): the norms (norms_cpu.cpp, used by model/fast_norms.py) and the
cross-entropy and SwiGLU (cross_entropy_cpu.cpp, swiglu_cpu.cpp, used by model/ops.py). All register ops
under torch.ops.normlab.

Where no compiler exists the build fails once, with a warning, and every fast path runs its reference.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch

SOURCES = [Path(__file__).parent / f"{name}_cpu.cpp" for name in ("norms", "cross_entropy", "swiglu")]
_loaded: bool | None = None  # None: not tried yet


def kernel_available() -> bool:
    """Build (or load the cached build of) the CPU kernels once per process; False if that fails."""
    global _loaded
    if _loaded is None:
        if os.environ.get("RANK", "0") == "0":  # once per job, not once per torchrun process
            print("[normlab] loading the fused CPU kernels (compiled on first use, about a minute; then cached)",
                  file=sys.stderr, flush=True)
        # -fopenmp: at::parallel_for is an inline OpenMP loop; -march=native: AVX2/AVX-512 where present
        cflags = ["-O3", "-fopenmp"] + ([] if os.environ.get("NORMLAB_PORTABLE") else ["-march=native"])
        attempts = [(cflags, ["-fopenmp"])]
        if sys.platform.startswith("linux"):  # first with glibc's vector exp (libmvec), then without
            attempts.insert(0, (cflags + ["-DNORMLAB_LIBMVEC"], ["-fopenmp", "-lmvec"]))
        for extra_cflags, extra_ldflags in attempts:
            try:
                _build(extra_cflags, extra_ldflags)
                _loaded = True
                break
            except Exception as e:  # no compiler, no headers...: stay correct, just slower
                error = e
        else:
            warnings.warn(f"normlab: fused CPU kernels unavailable, using the reference paths ({error})",
                          stacklevel=2)
            _loaded = False
    return _loaded


def _build(extra_cflags: list[str], extra_ldflags: list[str]) -> None:
    from torch.utils.cpp_extension import load

    load(name="normlab_kernels", sources=[str(s) for s in SOURCES], extra_cflags=extra_cflags,
         extra_ldflags=extra_ldflags, extra_include_paths=[str(Path(__file__).parent)], is_python_module=False,
         verbose=False)
    _register_fake()


def _register_fake() -> None:
    """Shape-only versions of the ops so torch.compile can trace through them."""

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
