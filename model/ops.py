"""The cross-entropy and the SwiGLU activation, each as a reference in torch ops and as a fused CPU kernel
with the same math (model/kernels/), chosen by `model.ops_impl` (the norms have model.norm_impl).

- cross_entropy(logits (N, V), targets (N,)): mean over targets != ignore_index of
  logsumexp(logits_r) - logits_r[target_r], in float32 (float64 stays float64). The kernel keeps one
  logsumexp per row instead of the (N, V) log-softmax and writes softmax - onehot in one pass; it reads
  bfloat16 logits directly instead of copying them to float32 first.
- swiglu(a, b) = silu(a) * b (Shazeer, 2020). The kernel does one pass each way and saves only a and b;
  it computes in float32 and rounds once (the reference rounds silu(a) and then the product).

The fast versions run the reference wherever there is no kernel (CUDA, no compiler).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from model.kernels import kernel_available

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _kernel_for(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype in _DTYPES for t in tensors) and kernel_available()


def reference_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1) -> torch.Tensor:
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
    if _kernel_for(logits):
        return _FusedCrossEntropy.apply(logits.contiguous(), targets.long().contiguous(), ignore_index)
    return reference_cross_entropy(logits, targets, ignore_index)


def reference_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


class _FusedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.ops.normlab.swiglu_fwd(a, b)

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.normlab.swiglu_bwd(grad, *ctx.saved_tensors)


def fast_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape == b.shape and a.dtype == b.dtype and _kernel_for(a, b):
        return _FusedSwiGLU.apply(a.contiguous(), b.contiguous())
    return reference_swiglu(a, b)


class Ops(NamedTuple):
    cross_entropy: object
    swiglu: object


OPS_IMPLS = {"reference": Ops(reference_cross_entropy, reference_swiglu), "fast": Ops(fast_cross_entropy, fast_swiglu)}
