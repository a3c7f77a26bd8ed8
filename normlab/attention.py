"""Attention logits, read without changing them: the largest |q.k| scaled logit and the attention
entropy of queries and keys, and a capture of every `F.scaled_dot_product_attention` call (a
TorchFunctionMode that hands the call on untouched), for models whose attention the monitor
cannot recompute."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# attention scores materialized at once (64 MB in float32)
MAX_SCORES = 1 << 24


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2's logit soft-capping); cap 0: x."""
    return cap * torch.tanh(x / cap) if cap else x


def _allowed(mask: torch.Tensor | None, b, r, rows: int, B: int, H: int) -> torch.Tensor | None:
    """The part of an SDPA attn_mask (bool: True attends; float: added to the logits, so a key
    attends where it is above the dtype's lowest / 2) for batch slice b and query rows r..r+rows."""
    if mask is None:
        return None
    m = mask if mask.dim() == 4 else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    m = m[b] if m.shape[0] > 1 else m
    m = m[..., r : r + rows, :] if m.shape[-2] > 1 else m
    if m.dtype == torch.bool:
        return m
    return m > torch.finfo(m.dtype).min / 2


def qk_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    cap: float = 0.0,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """From queries (B, H, T, hd) and keys (B, kv, S, hd): the largest |q.k| x scale (1/sqrt(hd)
    by default) over heads and the (query, key) pairs that attend (causal ones, those `mask`
    allows), before any soft-capping (Wortsman et al. 2023: the growth a cap hides still shows),
    and the entropy -sum_j a_ij log a_ij (nats) of the attention distribution a_i =
    softmax_j(softcap(logits_ij)) over those keys, averaged over batch, heads and queries;
    float32. At most MAX_SCORES scores exist at once: as many whole sequences as that holds, or
    else blocks of query positions of one sequence."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # each kv head to its query group
    B, H, T, hd = q.shape
    S = k.shape[2]
    rows = max(1, min(T, MAX_SCORES // (H * S)))
    chunk = max(1, MAX_SCORES // (H * T * S)) if rows == T else 1
    keys = torch.arange(S, device=q.device)
    best = torch.zeros((), device=q.device)
    entropy = torch.zeros((), device=q.device)
    for start in range(0, B, chunk):
        b = slice(start, start + chunk)
        kb = k[b].float().transpose(-1, -2)
        for r in range(0, T, rows):
            allowed = torch.ones(1, dtype=torch.bool, device=q.device)
            if causal:  # key j attends to query i when j <= i (+ S - T past keys)
                queries = torch.arange(r, min(r + rows, T), device=q.device) + (S - T)
                allowed = queries[:, None] >= keys[None, :]
            given = _allowed(mask, b, r, rows, B, H)
            allowed = allowed if given is None else allowed & given
            scores = q[b, :, r : r + rows].float() @ kb
            scores = scores / math.sqrt(hd) if scale is None else scores * scale
            best = torch.maximum(best, scores.abs().masked_fill(~allowed, 0).amax())
            weights = softcap(scores, cap).masked_fill(~allowed, float("-inf")).softmax(-1)
            del scores  # before the weights' log terms exist
            # 0 log 0 = 0: keys that do not attend add nothing (a query with none: NaN -> 0)
            terms = torch.special.xlogy(weights, weights).nan_to_num(0.0)
            entropy = entropy - terms.sum()
            del weights, terms  # before the next block's scores exist
    return best, entropy / (B * H * T)


class SdpaCapture(TorchFunctionMode):
    """While active, every F.scaled_dot_product_attention call runs as it would (same arguments,
    same result) and its queries and keys are handed to `seen(q, k, scale, mask, causal)` first,
    under no_grad."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            given = {**dict(zip(names, args, strict=False)), **kwargs}
            with torch.no_grad():
                self.seen(
                    given["query"].detach(),
                    given["key"].detach(),
                    given.get("scale"),
                    given.get("attn_mask"),
                    bool(given.get("is_causal", False)),
                )
        return func(*args, **kwargs)
