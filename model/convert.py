"""Norm conversions of a trained model. swap_norms is the naive swap: every LayerNorm / RMSNorm
module replaced by another norm with its gain carried over; the model then computes something else
(how much: its val loss before and after)."""

from __future__ import annotations

import torch
from torch import nn

from model.args import lookup
from model.norm_config import NORMS
from model.norms import _Norm


def swap_norms(module: nn.Module, to: str) -> int:
    """Replace every LayerNorm / RMSNorm (torch's or ours) in `module` by norm `to`; the count.

    Gains are carried over; a bias is carried over when the target has one (layernorm) and dropped
    otherwise. eps is kept. Modules already of the target type are left alone.
    """
    target = lookup(NORMS, to, "norm")
    sources = (nn.LayerNorm, nn.RMSNorm, _Norm)
    swaps = [
        (parent, child_name, child)
        for parent in module.modules()
        for child_name, child in parent.named_children()
        if isinstance(child, sources) and type(child) is not target
    ]
    for parent, child_name, old in swaps:
        # nn.RMSNorm(eps=None): float32's machine epsilon
        eps = old.eps if old.eps is not None else torch.finfo(torch.float32).eps
        has_bias = getattr(old, "bias", None) is not None and to == "layernorm"
        new = target(old.normalized_shape, eps=eps, bias=has_bias)
        if getattr(old, "weight", None) is not None and getattr(new, "weight", None) is not None:
            new.weight.data.copy_(old.weight.data)
        if has_bias:
            new.bias.data.copy_(old.bias.data)
        ref = getattr(old, "weight", None)
        if ref is not None:
            new.to(device=ref.device, dtype=ref.dtype)
        setattr(parent, child_name, new)
    return len(swaps)
