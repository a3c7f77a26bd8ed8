"""The fused path of the norms: the formulas and precision policy of model/norms.py, in one kernel
each way.

- CPU: torch.ops.normlab.norm (fused/norms_cpu.cpp), whose autograd is in C++: one pass for the row
  statistics, one for the output; the backward saves only the input and the per-row 1/rms (and mean)
  instead of every intermediate. torch.compile traces it (into norm_fwd / norm_bwd, with fake
  kernels) without a graph break.
- CUDA: torch's own fused kernels (F.rms_norm / F.layer_norm) on float32, then the gain.
- Elsewhere, or where no compiler exists: None, and the norm runs its formula.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fused import kernel_available

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _supported(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """The kernel's dtype combinations: weight in x's dtype, or float32 under a 16-bit x."""
    if x.dtype not in _DTYPES:
        return False
    return (
        weight is None
        or weight.dtype == x.dtype
        or (weight.dtype == torch.float32 and x.dtype != torch.float64)
    )


def _dtensor(t: torch.Tensor | None) -> bool:
    return type(t).__name__ == "DTensor"  # without importing torch.distributed


def fused_norm(
    x: torch.Tensor,
    shape: tuple[int, ...],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    center: bool,
) -> torch.Tensor | None:
    """normalize(x) * weight (+ bias) over the last dims `shape` of x (already checked to match),
    centred (LayerNorm) or not (RMSNorm), through a fused path of x's device; None where there is
    none."""
    if x.device.type == "cpu":
        if (
            x.numel() == 0
            or not _supported(x, weight)
            or _dtensor(x)
            or _dtensor(weight)
            or _dtensor(bias)
            or not kernel_available()
        ):
            # empty: the formula gives empty outputs and zero gain gradients; DTensor: its own ops
            return None
        # several normalized dims: one gain per flattened element
        if weight is not None and weight.dim() != 1:
            weight, bias = weight.reshape(-1), None if bias is None else bias.reshape(-1)
        return torch.ops.normlab.norm(x, math.prod(shape), weight, bias, eps, center)
    if x.device.type == "cuda":
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = (F.layer_norm if center else F.rms_norm)(xf, shape, eps=eps).type_as(x)
        if weight is not None:
            y = y * weight
        return y + bias if bias is not None else y
    return None
