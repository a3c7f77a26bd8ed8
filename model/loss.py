"""Next-token cross-entropy, mean over the targets that are not ignore_index, in float32 (float64 stays
float64): the reference (F.cross_entropy on float32 logits) and a fused CPU kernel with the same result.

The fused path (model/kernels/cross_entropy_cpu.cpp) keeps one logsumexp per row instead of the
(rows, vocab) log-softmax, and writes the gradient softmax - onehot in one pass; it reads bfloat16 logits
directly instead of copying them to float32 first. Elsewhere (CUDA, no compiler) it is the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.kernels import kernel_available

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def reference_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1) -> torch.Tensor:
    """mean over kept rows r of logsumexp(logits_r) - logits_r[targets_r]; logits (N, V), targets (N,)."""
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets,
                           ignore_index=ignore_index)


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
        dlogits = torch.ops.normlab.cross_entropy_bwd(grad / count, logits, targets, lse, ctx.ignore_index)
        return dlogits, None, None


def fast_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1) -> torch.Tensor:
    """The same loss through the fused CPU kernel where there is one, else the reference."""
    if logits.device.type == "cpu" and logits.dtype in _DTYPES and kernel_available():
        return _FusedCrossEntropy.apply(logits.contiguous(), targets.long().contiguous(), ignore_index)
    return reference_cross_entropy(logits, targets, ignore_index)


LOSS_IMPLS = {"reference": reference_cross_entropy, "fast": fast_cross_entropy}
