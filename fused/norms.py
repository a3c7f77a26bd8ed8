"""The fused path of the norms: the formulas and precision policy of model/norms.py, in one kernel each way.

- CPU: the C++ kernel (fused/norms_cpu.cpp). One pass for the row statistics, one for the output; the
  backward saves only the input and the per-row 1/rms (and mean) instead of every intermediate.
- CUDA: torch's own fused kernels (F.rms_norm / F.layer_norm) on float32, then the gain.
- Elsewhere, or where no compiler exists: None, and the norm runs its formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fused import kernel_available

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class _FusedNorm(torch.autograd.Function):
    """y = normalize(x) * w (+ b) over the rows of a 2-d x, with the fused CPU kernel both ways."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, center: bool):
        y, rstd, mean = torch.ops.normlab.norm_fwd(x, weight, bias, eps, center)
        ctx.save_for_backward(x, weight, rstd, mean)
        ctx.center, ctx.has_bias = center, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd, mean = ctx.saved_tensors
        dx, dw, db = torch.ops.normlab.norm_bwd(grad, x, weight, rstd, mean, ctx.center, ctx.has_bias)
        return dx, dw, db, None, None


def fused_norm(x: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, center: bool) -> torch.Tensor | None:
    """normalize(x) * weight (+ bias) over the last dims `shape` of x (already checked to match), centred
    (LayerNorm) or not (RMSNorm), through a fused path of x's device; None where there is none."""
    if x.numel() == 0:  # nothing to fuse; the formula gives empty outputs and zero gain gradients
        return None
    if any(type(t).__name__ == "DTensor" for t in (x, weight, bias)):  # sharded (tensor parallel): DTensor ops
        return None
    d = 1
    for s in shape:
        d *= s
    supported = x.dtype in _DTYPES and (weight is None or weight.dtype in (x.dtype, torch.float32)
                                        and x.dtype != torch.float64 or weight.dtype == x.dtype)
    if x.device.type == "cpu" and supported and kernel_available():
        flat = lambda p: None if p is None else p.reshape(d)  # noqa: E731
        y = _FusedNorm.apply(x.reshape(-1, d).contiguous(), flat(weight), flat(bias), eps, center)
        return y.view(*x.shape[: x.dim() - len(shape)], *shape)
    if x.device.type == "cuda":
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = (F.layer_norm if center else F.rms_norm)(xf, shape, eps=eps).type_as(x)
        if weight is not None:
            y = y * weight
        return y + bias if bias is not None else y
    return None
