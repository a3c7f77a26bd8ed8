"""LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities",
Sec. 2): how much an arm's final loss depends on getting the learning rate right, over the study's LR grid G,

    S = mean_{lr in G} [ min(L(lr), L0) - L* ],

L(lr) the final val loss of the run at that LR (a run that failed counts at its final loss, capped at L0; a
non-finite one at L0), L0 the loss at initialization, L* the best final loss of any arm of the same model size
(the lowest mean over seeds at any grid LR). It is continuous and needs no failure rule. Lower is less sensitive.
The same with L* the arm's own best (Wortsman et al.'s min over one algorithm's LRs) is reported beside it: the
two differ where an arm never reaches another arm's best at that size (its S then includes that gap).
Per seed where the arm ran every grid LR; per arm the mean over seeds with a seed-bootstrap 95% CI; two arms
that share seeds are compared by their per-seed differences (study/paired.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from study.arms import Arm

SIZE = ("model.dim", "model.n_layers", "model.hidden_dim", "model.n_heads")  # what makes two arms one model size
BOOTSTRAP = 2000


def capped(run, l0: float) -> float:
    """min(L, L0): the run's final val loss, capped at L0 (non-finite or missing: L0)."""
    v = run.summary.get("final_val_loss")
    return l0 if v is None or not math.isfinite(v) else min(v, l0)


@dataclass
class Sensitivity:
    per_seed: dict  # {seed: S}
    mean: float | None
    ci: tuple[float, float] | None  # seed bootstrap, percentile 95%
    lrs: tuple  # the grid it is measured over
    l_star: float | None

    def describe(self) -> str:
        if self.mean is None:
            return "no seed ran every LR of the grid"
        ci = f"95% CI {self.ci[0]:.3f}..{self.ci[1]:.3f}, " if self.ci else ""
        return f"{self.mean:.3f} nats ({ci}n = {len(self.per_seed)} seeds, over {len(self.lrs)} LRs)"


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
    """Percentile 95% CI of the mean by resampling the values (seeds) with replacement; None for fewer than 3 (two
    seeds have three resamples: no interval)."""
    if len(values) < 3:
        return None
    rng = np.random.default_rng(seed)
    v = np.asarray(values)
    means = v[rng.integers(0, len(v), (BOOTSTRAP, len(v)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _peers(label: str, arm: Arm, own: bool) -> tuple:
    """Which arms share an L*: those of the same model size, or (own) the arm alone."""
    return (label,) if own else tuple(arm.runs[0].config.get(k) for k in SIZE)


def l_stars(arms: dict[str, Arm], lrs, own: bool = False) -> dict[tuple, float]:
    """{model size: L*}: the lowest mean final loss (over seeds, capped at L0) of any arm of that size at any LR;
    own=True: {(arm label,): L*} of each arm's own runs (Wortsman et al.'s min over the LRs of one algorithm)."""
    out: dict[tuple, float] = {}
    for label, a in arms.items():
        size = _peers(label, a, own)
        for lr in lrs:
            vals = [capped(r, r.init_loss or math.inf) for r in a.at(lr) if r.finished]
            if vals:
                out[size] = min(out.get(size, math.inf), statistics.fmean(vals))
    return out


def sensitivities(arms: dict[str, Arm], lrs, own: bool = False) -> dict[str, Sensitivity]:
    """Every arm's LR sensitivity over `lrs` (the study file's grid); own=True with L* the arm's own best."""
    lrs = tuple(sorted(lrs))
    stars = l_stars(arms, lrs, own)
    out = {}
    for label, a in arms.items():
        l_star = stars.get(_peers(label, a, own))
        seeds = per_seed(a, lrs, l_star) if l_star is not None and lrs else {}
        mean = statistics.fmean(seeds.values()) if seeds else None
        out[label] = Sensitivity(seeds, mean, bootstrap_ci(list(seeds.values())), lrs, l_star)
    return out
