"""Validation: the loss over a fixed set of val windows, with its standard error and in bits per
byte, on any number of processes."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from data.loader import eval_batches
from training import distributed, faults
from training.config import Config


def bits_per_byte(loss_sum: float, n_bytes: float) -> float:
    """Summed next-token loss (nats) over the bytes of text those tokens encode, in bits: comparable
    across tokenizers and corpora, where nats per token are not."""
    return loss_sum / math.log(2) / n_bytes if n_bytes > 0 else float("nan")


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    tokens,
    cfg: Config,
    d: distributed.Dist,
    autocast,
    batch_size: int,
    token_bytes: torch.Tensor | None = None,
) -> dict[str, float]:
    """{'val/loss': mean next-token loss, 'val/loss_se': its standard error, 'val/bpb': bits per
    byte} over the fixed validation set (the same tokens at every eval); val/bpb where `token_bytes`
    (the bytes of text each id stands for, data/tokenizer.py) is given.

    The standard error is over windows (seq_len tokens each): sd of the per-window mean losses /
    sqrt(windows). Windows are consecutive text, so it is the eval's own sampling noise, a lower
    bound if windows correlate."""
    model.eval()
    # (sum of losses over tokens, tokens, sum of per-window means, sum of their squares, windows,
    # target bytes)
    total = torch.zeros(6, device=d.device, dtype=torch.float64)
    for x, y, counts in eval_batches(
        tokens, cfg.train.seq_len, batch_size, cfg.train.eval_tokens, d.data_rank, d.data_world
    ):
        x, y = x.to(d.device), y.to(d.device)
        with autocast:  # every rank runs as many forwards as the others (padding batches count 0)
            logits, loss = model(x, y)
        if counts:
            per_window = F.cross_entropy(
                logits.float().flatten(0, 1), y.flatten(), reduction="none"
            ).view(y.shape)
            w = per_window.double().mean(1)
            n_bytes = (
                token_bytes[y].sum().double()
                if token_bytes is not None
                else torch.zeros((), device=d.device, dtype=torch.float64)
            )
            total += torch.stack(
                [
                    loss.double() * y.numel(),
                    torch.tensor(y.numel(), device=d.device).double(),
                    w.sum(),
                    w.pow(2).sum(),
                    torch.tensor(len(w), device=d.device).double(),
                    n_bytes,
                ]
            )
        faults.point("eval")
    model.train()
    distributed.all_reduce(total)
    # the ranks of a tensor-parallel group counted the same windows
    total /= d.world_size // d.data_world
    loss_sum, n_tokens, s1, s2, n, n_bytes = total.tolist()
    var = max(0.0, (s2 - s1 * s1 / n) / (n - 1)) if n > 1 else 0.0
    out = {
        "val/loss": loss_sum / n_tokens,
        "val/loss_se": math.sqrt(var / n) if n > 1 else float("nan"),
    }
    if token_bytes is not None:
        out["val/bpb"] = bits_per_byte(loss_sum, n_bytes)
    return out


def sample(model: torch.nn.Module, tok, tokens: int, seed: int, autocast) -> str:
    """A short continuation of a fixed prompt, seeded: the same text for the same weights."""
    device = next(model.parameters()).device
    prompt = torch.tensor([tok.encode("The ")], device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    with autocast:
        out = model.generate(prompt, tokens, temperature=0.8, top_k=50, generator=gen)
    model.train()
    return repr(tok.decode(out[0].tolist()))
