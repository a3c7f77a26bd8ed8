"""The numbers of a study, per arm: its runs by LR and seed, losses of the runs that trained, its
failure curve, outcome counts, the largest LR at which every seed trained."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from lab.lr50 import FailureFit, fit_failure_curve
from lab.read import INSTABILITY, KINDS, OUTCOMES, Run


def mean_of(xs):
    """The mean of the values that are not None (None if there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def unstable(run: Run) -> bool | None:
    """Failed by instability (True), trained or failed otherwise (False), or censored (None: slow,
    no curve)."""
    return None if run.kind in ("slow", "no curve") else run.kind in INSTABILITY


@dataclass
class Arm:
    label: str
    runs: list[Run]
    best_lr: float | None = (
        None  # chosen on the selection seeds (lab/result.py); None before or if none trained
    )
    floor: float | None = (
        None  # the lowest LR where every selection seed trained (lab/protocol.py floor)
    )
    lrs: list[float] = field(init=False)
    l0: float | None = field(init=False)

    def __post_init__(self):
        self.lrs = sorted({r.lr for r in self.runs})
        self.l0 = mean_of([r.init_loss for r in self.runs])

    def at(self, lr: float) -> list[Run]:
        return [r for r in self.runs if r.lr == lr]

    def losses(self, lr: float, seeds=None) -> dict:
        """{seed: final val loss} of the runs at this LR that trained (of these seeds): the unit of
        every paired loss comparison; a run that failed is not a loss."""
        return {
            r.seed: r.loss
            for r in self.at(lr)
            if r.loss is not None and (seeds is None or r.seed in seeds)
        }

    @property
    def max_lr_ok(self) -> float | None:
        """The largest LR at which every run of the arm trained."""
        ok = [lr for lr in self.lrs if self.at(lr) and all(r.trained for r in self.at(lr))]
        return max(ok) if ok else None

    def upper(self) -> list[Run]:
        """The finished runs from the floor up: a failure below the floor was too slow to learn
        within the budget, not unstable, and stays out of the failure curve (counted apart:
        slow())."""
        return [r for r in self.runs if r.finished and (self.floor is None or r.lr >= self.floor)]

    def slow(self) -> list[Run]:
        """Runs below the floor that failed under the study's rule."""
        return [r for r in self.runs if r.failed and self.floor is not None and r.lr < self.floor]

    def curve(self, failed=None, seeds=None) -> tuple[list[float], list[bool]]:
        """(lrs, failed) of the runs P(fail | lr) is fitted to, from the floor up; `failed(run)`
        overrides the study's rule (True, False, or None for a censored run left out), its floor
        then the lowest LR where every one of `seeds` trained under it."""
        if failed is None:
            done = self.upper()
            return [r.lr for r in done], [r.failed for r in done]
        by_lr: dict[float, list[bool]] = {}
        for r in self.runs:
            if r.finished and (seeds is None or r.seed in seeds) and failed(r) is not None:
                by_lr.setdefault(r.lr, []).append(failed(r))
        ok = [lr for lr, fs in by_lr.items() if not any(fs)]
        low = min(ok) if ok else None
        done = [
            r
            for r in self.runs
            if r.finished and (low is None or r.lr >= low) and failed(r) is not None
        ]
        return [r.lr for r in done], [failed(r) for r in done]

    def failure(self, failed=None, seeds=None) -> FailureFit:
        """P(fail | lr) from the floor up (lab/lr50.py); see curve()."""
        return fit_failure_curve(*self.curve(failed, seeds))

    def instability(self, seeds=None) -> FailureFit:
        """P(fail | lr) for instability alone: collapsed, blew up or non-finite runs fail; slow ones
        (still learning when the budget ended) are censored, left out; every other finished run
        trained."""
        return self.failure(unstable, seeds)

    def kinds(self) -> dict[float, dict[str, int]]:
        """{lr: {'runs': n, 'trained': k, kind: count of failed runs of that kind}} over finished
        runs."""
        out: dict[float, dict[str, int]] = {}
        for r in self.runs:
            if r.finished:
                row = out.setdefault(r.lr, {"runs": 0, "trained": 0, **{k: 0 for k in KINDS}})
                row["runs"] += 1
                row["trained" if r.kind is None else r.kind] += 1
        return dict(sorted(out.items()))

    def outcomes(self) -> dict[str, int]:
        counts = {o: 0 for o in OUTCOMES}
        for r in self.runs:
            counts[r.status if r.status in counts else "failed"] += 1
        return counts

    def summary_mean(self, key: str) -> float | None:
        return mean_of(
            [
                r.summary.get(key)
                for r in self.runs
                if r.status in ("ok", "plateau", "collapsed", "unstable")
            ]
        )

    def tokens_per_s(self) -> float | None:
        v = [r.summary.get("tokens_per_s") for r in self.runs if r.summary.get("tokens_per_s")]
        return statistics.median(v) if v else None


def max_series(run: Run, prefix: str) -> float | None:
    """The largest value of any metric starting with `prefix` over the run's records."""
    vals = [
        v for rec in run.records for k, v in rec.items() if k.startswith(prefix) and v is not None
    ]
    return max(vals) if vals else None


def one_field_pairs(arms: dict[str, Arm], keys: list[str]) -> list[tuple[Arm, Arm, str]]:
    """Every pair of arms that differ in exactly one config field: (A, B, the field)."""
    out, labels = [], list(arms)
    for i, la in enumerate(labels):
        for lb in labels[i + 1 :]:
            a, b = arms[la], arms[lb]
            diff = [k for k in keys if a.runs[0].config.get(k) != b.runs[0].config.get(k)]
            if len(diff) == 1:
                out.append((a, b, diff[0]))
    return out
