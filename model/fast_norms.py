"""Fast paths for the norms: the same formulas and precision policy as model/norms.py, fused.

- CPU: a C++ kernel (model/kernels/norms_cpu.cpp, built on first use by model/kernels/__init__.py). One
  pass for the row statistics, one for the output; backward saves only the input and the per-row 1/rms
  (and mean), instead of every intermediate.
- CUDA: torch's own fused kernels (F.rms_norm / F.layer_norm) on float32, then the gain.
- Elsewhere, or where no compiler exists, the reference formula (with a warning once).

Set `model.norm_impl: fast`; the reference stays the readable definition and the tests hold both equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.kernels import kernel_available
from model.norms import LayerNorm, NoNorm, RMSNorm

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


def fused_norm(norm, x: torch.Tensor, center: bool) -> torch.Tensor | None:
    """`norm`'s output for x through a fused path of x's device, or None where there is none."""
    norm.check_input(x)
    if x.numel() == 0:  # nothing to fuse; the reference gives empty outputs and zero gain gradients
        return None
    shape = norm.normalized_shape
    d = 1
    for s in shape:
        d *= s
    w = norm.weight
    supported = x.dtype in _DTYPES and (w is None or w.dtype in (x.dtype, torch.float32) and x.dtype != torch.float64
                                        or w.dtype == x.dtype)
    if x.device.type == "cpu" and supported and kernel_available():
        flat = lambda p: None if p is None else p.reshape(d)
        y = _FusedNorm.apply(x.reshape(-1, d).contiguous(), flat(norm.weight), flat(norm.bias), norm.eps, center)
        return y.view(*x.shape[: x.dim() - len(shape)], *shape)
    if x.device.type == "cuda":
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        fn = F.layer_norm if center else F.rms_norm
        y = fn(xf, shape, eps=norm.eps).type_as(x)
        if norm.weight is not None:
            y = y * norm.weight
        return y + norm.bias if norm.bias is not None else y
    return None


class FastRMSNorm(RMSNorm):
    """RMSNorm (same formula and parameters) through a fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = fused_norm(self, x, center=False)
        return super().forward(x) if y is None else y


class FastLayerNorm(LayerNorm):
    """LayerNorm (same formula and parameters) through a fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = fused_norm(self, x, center=True)
        return super().forward(x) if y is None else y


FAST_NORMS = {"rmsnorm": FastRMSNorm, "layernorm": FastLayerNorm, "none": NoNorm}
