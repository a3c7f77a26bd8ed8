"""Validation: the loss over a fixed set of val windows, with its standard error, on any number of processes."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from data.loader import eval_batches
from training import distributed, faults
from training.config import Config


@torch.no_grad()
def evaluate(model: torch.nn.Module, tokens, cfg: Config, d: distributed.Dist, autocast,
             batch_size: int) -> tuple[float, float]:
    """(mean next-token loss, its standard error) over the fixed validation set (the same tokens at every eval).

    The standard error is over windows (seq_len tokens each): sd of the per-window mean losses / sqrt(windows).
    Windows are consecutive text, so it is the eval's own sampling noise, a lower bound if windows correlate."""
    model.eval()
    # (sum of losses over tokens, tokens, sum of per-window means, sum of their squares, windows)
    total = torch.zeros(5, device=d.device, dtype=torch.float64)
    for x, y, counts in eval_batches(tokens, cfg.train.seq_len, batch_size, cfg.train.eval_tokens, d.data_rank,
                                     d.data_world):
        x, y = x.to(d.device), y.to(d.device)
        with autocast:  # every rank runs as many forwards as the others (padding batches count 0)
            logits, loss = model(x, y)
        if counts:
            per_window = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
            w = per_window.double().mean(1)
            total += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), device=d.device).double(),
                                  w.sum(), w.pow(2).sum(), torch.tensor(len(w), device=d.device).double()])
        faults.point("eval")
    model.train()
    distributed.all_reduce(total)
    total /= d.world_size // d.data_world  # the ranks of a tensor-parallel group counted the same windows
    loss_sum, n_tokens, s1, s2, n = total.tolist()
    var = max(0.0, (s2 - s1 * s1 / n) / (n - 1)) if n > 1 else 0.0
    return loss_sum / n_tokens, math.sqrt(var / n) if n > 1 else float("nan")

