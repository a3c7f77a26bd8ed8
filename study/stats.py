"""The numbers of a study, per arm: best LR, finals over seeds, LR sensitivity, max LR that trains, outcomes."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from study.runs import OUTCOMES, Run


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


@dataclass
class Arm:
    label: str
    runs: list[Run]
    lrs: list[float] = field(init=False)
    l0: float | None = field(init=False)

    def __post_init__(self):
        self.lrs = sorted({r.lr for r in self.runs})
        self.l0 = _mean([r.init_loss for r in self.runs])

    def at(self, lr: float) -> list[Run]:
        return [r for r in self.runs if r.lr == lr]

    def clipped(self, lr: float) -> float | None:
        """Mean over seeds of v = min(L(lr), L0) (Run.value; a diverged run counts as its L0)."""
        return _mean(list(self.per_seed(lr).values()))

    @property
    def best_lr(self) -> float | None:
        scored = [(self.clipped(lr), lr) for lr in self.lrs if self.clipped(lr) is not None]
        return min(scored)[1] if scored else None

    @property
    def max_lr_ok(self) -> float | None:
        ok = [lr for lr in self.lrs if self.at(lr) and all(r.status == "ok" for r in self.at(lr))]
        return max(ok) if ok else None

    def per_seed(self, lr: float) -> dict:
        """{seed: run.value} at this learning rate (the unit of every paired comparison)."""
        return {r.seed: r.value for r in self.at(lr) if r.value is not None}

    def sensitivity_per_seed(self) -> dict:
        """{seed: LR sensitivity of that seed's runs}: mean over the LR grid of v(lr) - min v, v = min(L, L0) per
        run (Wortsman et al. 2023, per seed); only seeds that have every LR of the arm."""
        out = {}
        for seed in sorted({r.seed for r in self.runs}, key=str):
            vals = [self.per_seed(lr).get(seed) for lr in self.lrs]
            if vals and all(v is not None for v in vals):
                out[seed] = statistics.fmean(v - min(vals) for v in vals)
        return out

    def outcomes(self) -> dict[str, int]:
        counts = {o: 0 for o in OUTCOMES}
        for r in self.runs:
            counts[r.status if r.status in counts else "failed"] += 1
        return counts

    def summary_mean(self, key: str) -> float | None:
        return _mean([r.summary.get(key) for r in self.runs if r.status in ("ok", "plateau", "collapsed",
                                                                                   "unstable")])

    def tokens_per_s(self) -> float | None:
        v = [r.summary.get("tokens_per_s") for r in self.runs if r.summary.get("tokens_per_s")]
        return statistics.median(v) if v else None


def _max_series(run: Run, prefix: str) -> float | None:
    vals = [v for rec in run.records for k, v in rec.items() if k.startswith(prefix) and v is not None]
    return max(vals) if vals else None


def fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)
