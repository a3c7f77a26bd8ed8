"""LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities", Sec. 2): how much an arm's final loss depends on getting the learning rate right,
over the study's LR grid G,

    S = mean_{lr in G} [ min(L(lr), L0) - L* ],

L(lr) the final val loss of the run at that LR (a run that failed counts at its final loss, capped
at L0; a non-finite one at L0), L0 the loss at initialization, L* the arm's own best (the lowest
mean over seeds at any grid LR: Wortsman et al.'s min over one algorithm's LRs). It is continuous
and needs no failure rule. Lower is less sensitive. The same with L* the best of any arm of the same
model size is reported beside it (per_size=True): it charges an arm its gap to another arm's best
loss. Where an arm's best LR is an end of the grid its L* is not bracketed (a better LR may lie
beyond), and the report says so. Per seed where the arm ran every grid LR; per arm the mean over
seeds with a 95% t interval (n - 1 df) below BOOTSTRAP_FROM seeds (simulated coverage 0.93-0.96 at
n = 3, 5 and 8, where a percentile bootstrap covers 0.75, 0.80 and 0.88:
tests/lab/test_sensitivity.py), a seed bootstrap from there; two arms that share seeds are compared
by their per-seed differences (lab/paired.py)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from lab.arms import Arm
from lab.paired import mean_ci

# what makes two arms one model size
SIZE = ("model.dim", "model.n_layers", "model.hidden_dim", "model.n_heads")
BOOTSTRAP = 2000
BOOTSTRAP_FROM = (
    30  # seeds: below this the per-arm CI is a t interval (a bootstrap of 8 covers ~0.88)
)


def capped(run, l0: float) -> float:
    """min(L, L0): the run's final val loss, capped at L0 (non-finite or missing: L0)."""
    v = run.summary.get("final_val_loss")
    return l0 if v is None or not math.isfinite(v) else min(v, l0)


@dataclass
class Sensitivity:
    per_seed: dict  # {seed: S}
    mean: float | None
    ci: tuple[float, float] | None  # 95%: t below BOOTSTRAP_FROM seeds, else a seed bootstrap
    lrs: tuple  # the grid it is measured over
    l_star: float | None
    best_lr: float | None = None  # the grid LR where the arm's own mean loss is lowest
    bracketed: bool = True  # best_lr is inside the grid, not at an end

    def describe(self) -> str:
        if self.mean is None:
            return "no seed ran every LR of the grid"
        ci = f"95% CI {self.ci[0]:.3f}..{self.ci[1]:.3f}, " if self.ci else ""
        edge = (
            ""
            if self.bracketed
            else f"; its best LR {self.best_lr:g} is an end of the grid: not bracketed"
        )
        n, k = len(self.per_seed), len(self.lrs)
        return f"{self.mean:.3f} nats ({ci}n = {n} seeds, over {k} LRs{edge})"


def _l0(arm: Arm, seed) -> float | None:
    vals = [r.init_loss for r in arm.runs if r.seed == seed and r.init_loss is not None]
    return statistics.fmean(vals) if vals else arm.l0


def per_seed(arm: Arm, lrs, l_star: float) -> dict:
    """{seed: S} for every seed with a finished run at every LR of `lrs`."""
    out = {}
    for seed in sorted({r.seed for r in arm.runs}, key=str):
        at = {r.lr: r for r in arm.runs if r.seed == seed and r.finished}
        l0 = _l0(arm, seed)
        if l0 is not None and all(lr in at for lr in lrs):
            out[seed] = statistics.fmean(capped(at[lr], l0) - l_star for lr in lrs)
    return out


def bootstrap_ci(values: list[float], seed: int = 0) -> tuple[float, float] | None:
    """Percentile 95% CI of the mean by resampling the values (seeds) with replacement; None for
    fewer than 3."""
    if len(values) < 3:
        return None
    rng = np.random.default_rng(seed)
    v = np.asarray(values)
    means = v[rng.integers(0, len(v), (BOOTSTRAP, len(v)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def mean_interval(values: list[float]) -> tuple[float, float] | None:
    """The per-arm 95% CI of a mean over seeds: t (n - 1 df) below BOOTSTRAP_FROM seeds, else the
    bootstrap."""
    if len(values) >= BOOTSTRAP_FROM:
        return bootstrap_ci(values)
    return mean_ci(values)[1]


def _peers(label: str, arm: Arm, per_size: bool) -> tuple:
    """Which arms share an L*: the arm alone, or (per_size) those of the same model size."""
    return tuple(arm.runs[0].config.get(k) for k in SIZE) if per_size else (label,)


def _means(a: Arm, lrs) -> dict[float, float]:
    """{lr: mean final loss over seeds, capped at L0} at the grid LRs the arm ran."""
    out = {}
    for lr in lrs:
        vals = [capped(r, r.init_loss or math.inf) for r in a.at(lr) if r.finished]
        if vals:
            out[lr] = statistics.fmean(vals)
    return out


def l_stars(arms: dict[str, Arm], lrs, per_size: bool = False) -> dict[tuple, float]:
    """{(arm label,): L*}, each arm's own lowest mean final loss (over seeds, capped at L0) at any
    grid LR; per_size=True: {model size: L*} over every arm of that size."""
    out: dict[tuple, float] = {}
    for label, a in arms.items():
        size = _peers(label, a, per_size)
        for v in _means(a, lrs).values():
            out[size] = min(out.get(size, math.inf), v)
    return out


def sensitivities(arms: dict[str, Arm], lrs, per_size: bool = False) -> dict[str, Sensitivity]:
    """Every arm's LR sensitivity over `lrs` (the study file's grid), L* its own best (per_size: its
    size's)."""
    lrs = tuple(sorted(lrs))
    stars = l_stars(arms, lrs, per_size)
    out = {}
    for label, a in arms.items():
        l_star = stars.get(_peers(label, a, per_size))
        seeds = per_seed(a, lrs, l_star) if l_star is not None and lrs else {}
        mean = statistics.fmean(seeds.values()) if seeds else None
        means = _means(a, lrs)
        best = min(means, key=means.get) if means else None
        out[label] = Sensitivity(
            seeds,
            mean,
            mean_interval(list(seeds.values())),
            lrs,
            l_star,
            best,
            best is None or len(lrs) < 3 or lrs[0] < best < lrs[-1],
        )
    return out
