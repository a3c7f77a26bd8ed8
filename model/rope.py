"""Rotary position embedding (Su et al. 2021) in Meta LLaMA's interleaved layout."""

from __future__ import annotations

import torch

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (seq_len, head_dim / 2)


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, device: torch.device | None = None
) -> Rope:
    """cos and sin of angle t * theta^(-2i / head_dim) for positions t and pair index i (float32, as
    LLaMA)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    )
    angles = torch.outer(
        torch.arange(max_seq_len, dtype=torch.int64, device=device).float(), inv_freq
    )
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) of every head by its angle (Meta LLaMA's interleaved
    layout): (a, b) -> (a cos - b sin, a sin + b cos), in float32 whatever x's dtype.

    Computed as x * (cos, cos) + (b, a) * (-sin, sin) on the whole head (tables interleaved to its
    width): the same products and sums as the pairwise formula, bit for bit in both directions,
    without splitting x into its pairs and stacking them back (one copy, the swap, instead of a
    stack each way). Real-valued rather than a complex multiply: torch.compile fuses it (complex
    ops fall back to eager) and bfloat16 / float16 models work (torch.complex rejects them)."""
    cos, sin = (t.float()[:, None, :] for t in rope)  # (T, 1, hd/2): broadcast over batch and heads
    cos2, sin2 = torch.stack((cos, cos), -1).flatten(-2), torch.stack((-sin, sin), -1).flatten(-2)
    xf = x.float()
    swapped = xf.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (b, a) in each pair's place
    return (xf * cos2 + swapped * sin2).type_as(x)
