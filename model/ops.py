"""The cross-entropy and the SwiGLU activation, each as a reference in torch ops and as a fused CPU
kernel with the same math (fused/ops.py), chosen by name: `model.ops_impl` (the norms:
model.norm_impl).

- cross_entropy(logits (N, V), targets (N,)): mean over targets != ignore_index of
  logsumexp(logits_r) - logits_r[target_r], in float32 (float64 stays float64). The kernel keeps one
  logsumexp per row instead of the (N, V) log-softmax and writes softmax - onehot in one pass; it
  reads bfloat16 logits directly instead of copying them to float32 first.
- swiglu(a, b) = silu(a) * b (Shazeer, 2020). The kernel does one pass each way and saves only a and
  b; it computes in float32 and rounds once (the reference rounds silu(a) and then the product).

The fused versions run the reference wherever there is no kernel (CUDA, no compiler).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from fused import ops as kernels


def reference_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1
) -> torch.Tensor:
    return F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)),
        targets,
        ignore_index=ignore_index,
    )


def fused_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1
) -> torch.Tensor:
    loss = kernels.fused_cross_entropy(logits, targets, ignore_index)
    return reference_cross_entropy(logits, targets, ignore_index) if loss is None else loss


def reference_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def fused_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h = kernels.fused_swiglu(a, b)
    return reference_swiglu(a, b) if h is None else h


class Ops(NamedTuple):
    cross_entropy: object
    swiglu: object


OPS_IMPLS = {
    "reference": Ops(reference_cross_entropy, reference_swiglu),
    "fused": Ops(fused_cross_entropy, fused_swiglu),
}
