"""AdamW with weight decay on matrices only (coupled to the LR, as torch's, or independent of it),
per-group LRs (the standard parametrization, or muParam (simple)), and the learning-rate schedule as
a function of the step. `cfg` is the config's optim section (training.config.OptimConfig: the
config's validation imports this module's registries, so this module does not import it)."""

from __future__ import annotations

import math

import torch
from torch import nn

from model.args import lookup
from model.llama import parameter_kinds

# optim.weight_decay_mode: the per-group weight_decay handed to torch's AdamW, which multiplies each
# decayed parameter by 1 - group lr(t) * group weight_decay every step, from wd (optim.weight_decay)
# and the group's peak LR
WEIGHT_DECAY_MODES = {
    # AdamW as torch and Optax implement it: the decay per step is wd * lr(t), so it moves with the
    # LR
    "coupled": lambda wd, peak: wd,
    # independent (Loshchilov & Hutter's decoupled form; Wortsman et al. 2023 Sec. 3.2.2): wd *
    # lr(t) / peak = wd * s_t, s_t the schedule in [0, 1]: the same decay whatever the peak LR (at
    # the peak it is wd itself)
    "independent": lambda wd, peak: wd / peak,
}


def _sp(kind: str, width: int, cfg) -> float:
    return 1.0


def _mup_simple(kind: str, width: int, cfg) -> float:
    """Wortsman et al. 2023 Sec. 3.2.4's muParam (simple): "scale the LR for linear layers by
    base-fan-in / fan-in", base-fan-in the fan-in of the same layer in the smallest model tested.
    Here every linear layer's weight (wq, wk, wv, wo, w1, w2, w3 and an untied output head: the
    'matrix' kind of model.llama.parameter_kinds) gets LR x mup_base_width / model.dim: each one's
    fan-in is dim, or for w2 the feed-forward width, proportional to dim up to LLaMA's rounding to
    multiple_of, which this ignores. The embedding (and a tied head, which is the embedding), norm
    gains and biases keep the configured LR. Nothing else changes: no init change (the paper's
    simple variant changes none; its baseline draws matrices with std 1/sqrt(fan-in), ours with
    model.init_std at every width, so a width sweep here also changes the init's scale relative to
    1/sqrt(fan-in)), and none of muParam (full)'s head init sqrt(base-fan-in) / fan-in, 1/d_head
    attention scaling or zero query init."""
    return cfg.mup_base_width / width if kind == "matrix" else 1.0


# optim.parametrization: each parameter's LR multiplier, by its kind (model.llama.parameter_kinds)
PARAMETRIZATIONS = {"sp": _sp, "mup_simple": _mup_simple}


def param_groups(model: nn.Module, cfg) -> list[dict]:
    """AdamW groups: decayed matrices, and everything else (norm gains, biases, and by default
    embeddings), split further by LR multiplier (`lr_scale`: the step's LR times it is the group's
    LR; mup_simple only). Kinds come from the owning module (model.llama.parameter_kinds), so a 2-d
    norm gain is never decayed. The standard parametrization gives exactly the two groups [decayed,
    not decayed] (old checkpoints' optimizer states load)."""
    # a tied head is the embedding
    decayed = {"matrix", "embedding"} if cfg.decay_embeddings else {"matrix"}
    scale = lookup(PARAMETRIZATIONS, cfg.parametrization, "optim.parametrization")
    decay = lookup(WEIGHT_DECAY_MODES, cfg.weight_decay_mode, "optim.weight_decay_mode")
    width = model.args.dim if cfg.parametrization != "sp" else 0
    groups: dict[tuple[bool, float], list] = {
        (True, scale("matrix", width, cfg)): [],
        (False, 1.0): [],
    }
    kinds = parameter_kinds(model)
    for name, p in model.named_parameters():
        if p.requires_grad:
            kind = kinds[name]
            groups.setdefault((kind in decayed, scale(kind, width, cfg)), []).append(p)
    return [
        {
            "params": groups[key],
            "lr_scale": key[1],
            "weight_decay": decay(cfg.weight_decay, peak_lr(cfg) * key[1]) if key[0] else 0.0,
        }
        for key in sorted(groups, key=lambda key: not key[0])
    ]  # decayed groups first (a stable sort)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every group's LR for a step whose scheduled LR is `lr`: lr times the group's lr_scale
    (param_groups)."""
    for group in opt.param_groups:
        # an optimizer state saved before lr_scale existed: 1
        group["lr"] = lr * group.get("lr_scale", 1.0)


def fused_adamw(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW (one kernel per parameter instead of a dozen ops) takes these:
    plain floating-point tensors on CPU or CUDA (sharded DTensors keep the default)."""
    return all(
        p.device.type in ("cpu", "cuda")
        and p.is_floating_point()
        and "DTensor" not in type(p.data).__name__
        for p in params
    )


def build_optimizer(model: nn.Module, cfg) -> torch.optim.AdamW:
    """AdamW over param_groups; fused where fused_adamw allows (the same update up to rounding)."""
    groups = param_groups(model, cfg)
    fused = fused_adamw([p for g in groups for p in g["params"]]) or None  # None: torch's default
    betas = (cfg.beta1, cfg.beta2)
    return torch.optim.AdamW(groups, lr=peak_lr(cfg), betas=betas, eps=cfg.eps, fused=fused)


def peak_lr(cfg) -> float:
    """The peak LR a run trains at: optim.lr x optim.lr_factor (a run at lr with factor k is the run
    at k lr, filed under lr: a control whose effect on any LR threshold is known)."""
    return cfg.lr * cfg.lr_factor


def lr_at(step: int, cfg, total_steps: int) -> float:
    """Learning rate of step `step` (0-based): linear warmup reaching peak_lr at step warmup_steps -
    1, then a cosine, linear or constant decay that reaches that peak * min_lr_ratio at step
    total_steps - 1 (the schedule's horizon, optim.schedule_steps) and holds it after that (a run
    extended past its horizon)."""
    if step < cfg.warmup_steps:  # a warmup as long as the run never leaves it
        return peak_lr(cfg) * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps + 1) / max(1, total_steps - cfg.warmup_steps))
    decay = {
        "cosine": 0.5 * (1 + math.cos(math.pi * progress)),
        "linear": 1 - progress,
        "constant": 1.0,
    }
    return peak_lr(cfg) * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay[cfg.schedule])
