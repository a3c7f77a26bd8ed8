"""The fused paths of the cross-entropy and SwiGLU (fused/cross_entropy_cpu.cpp,
fused/swiglu_cpu.cpp): the same math as their references in model/ops.py.

- cross-entropy: keeps one logsumexp per row instead of the (N, V) log-softmax and writes softmax -
  onehot in one pass; reads bfloat16 logits directly instead of copying them to float32 first.
- SwiGLU: one pass each way, saving only a and b; computes in float32 and rounds once.

Each returns None where it has no kernel (CUDA, no compiler), and the caller runs the reference.
"""

from __future__ import annotations

import torch

from fused import kernel_available

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _kernel_for(*tensors: torch.Tensor) -> bool:
    return (
        all(
            t.device.type == "cpu" and t.dtype in _DTYPES and type(t).__name__ != "DTensor"
            for t in tensors
        )
        and kernel_available()
    )


class _FusedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, ignore_index: int):
        losses, lse = torch.ops.normlab.cross_entropy_fwd(logits, targets, ignore_index)
        count = (targets != ignore_index).sum()
        ctx.save_for_backward(logits, targets, lse, count)
        ctx.ignore_index = ignore_index
        return losses.sum() / count  # 0 / 0 = NaN when every target is ignored, as F.cross_entropy

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse, count = ctx.saved_tensors
        dlogits = torch.ops.normlab.cross_entropy_bwd(
            grad / count, logits, targets, lse, ctx.ignore_index
        )
        return dlogits, None, None


def fused_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1
) -> torch.Tensor | None:
    if not _kernel_for(logits):
        return None
    return _FusedCrossEntropy.apply(logits.contiguous(), targets.long().contiguous(), ignore_index)


class _FusedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.ops.normlab.swiglu_fwd(a, b)

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.normlab.swiglu_bwd(grad, *ctx.saved_tensors)


def fused_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    if a.shape != b.shape or a.dtype != b.dtype or not _kernel_for(a, b):
        return None
    return _FusedSwiGLU.apply(a.contiguous(), b.contiguous())
