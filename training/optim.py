"""AdamW with weight decay on matrices only, and the learning-rate schedule as a function of the step."""

from __future__ import annotations

import math

import torch
from torch import nn

from model.llama import parameter_kinds
from training.config import OptimConfig


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Two groups: decayed matrices, and everything else (norm gains, biases, and by default embeddings).
    Kinds come from the owning module (model.llama.parameter_kinds), so a 2-d norm gain is never decayed."""
    decayed = {"matrix", "embedding"} if cfg.decay_embeddings else {"matrix"}  # a tied head is the embedding
    decay, no_decay = [], []
    kinds = parameter_kinds(model)
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if kinds[name] in decayed else no_decay).append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate of step `step` (0-based): linear warmup reaching cfg.lr at step warmup_steps - 1, then a
    cosine, linear or constant decay that reaches cfg.lr * min_lr_ratio at step total_steps - 1 (the schedule's
    horizon, optim.schedule_steps) and holds it after that (a run extended past its horizon)."""
    if step < cfg.warmup_steps:  # a warmup as long as the run never leaves it
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps + 1) / max(1, total_steps - cfg.warmup_steps))
    decay = {"cosine": 0.5 * (1 + math.cos(math.pi * progress)), "linear": 1 - progress, "constant": 1.0}
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay[cfg.schedule])
