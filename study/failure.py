"""Stability as a measured quantity: the probability that a run fails as a function of its learning rate, and LR50,
the learning rate at which half the seeds fail, with a 95% confidence interval.

    P(fail | lr) = 1 / (1 + exp(-b (log10 lr - x50))),    LR50 = 10^x50

fitted by logistic regression with Firth's penalty (the Jeffreys prior: 1/2 log det of the Fisher information),
which keeps the estimate finite under complete separation (every seed ok below some LR, every seed failing above:
the usual case on a coarse grid). The CI is the profile penalized likelihood interval: the x50 whose profile
deviance is within the chi-square(1) 95% quantile of the maximum (Heinze & Schemper 2002; Venzon & Moolgavkar
1988). Under separation the bracket (the last LR where every run was ok, the first where every run failed) is
reported beside it, since the data say nothing finer than that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import chi2

CHI2_95 = float(chi2.ppf(0.95, 1))
MAX_SLOPE = 200.0  # logit per decade of LR: steeper than this is a step, the penalty keeps the fit below it


@dataclass
class FailureFit:
    """One arm's failure curve over its runs (one run = one LR and one seed)."""

    lr50: float | None  # None: no failures, or all failures, or failure does not rise with the LR
    ci: tuple[float | None, float | None] | None  # 95% CI of LR50; a None end lies beyond the LRs tried (x 10^3)
    slope: float | None  # b: logit per decade of LR
    separated: bool  # every run below some LR ok, every run above it failed
    bracket: tuple[float, float] | None  # (largest LR where all ok, smallest LR where all failed), if any
    n: int  # runs
    failed: int  # of which failed

    def describe(self) -> str:
        """The fit in one phrase, with its n."""
        if self.lr50 is None:
            return f"no LR50 ({self.failed} of {self.n} runs failed)"
        lo, hi = self.ci if self.ci else (None, None)
        ci = f"95% CI {_g(lo) if lo else '<' + _g(self.lr50 / 1000)}..{_g(hi) if hi else '>' + _g(self.lr50 * 1000)}"
        sep = f"; complete separation between lr {_g(self.bracket[0])} and {_g(self.bracket[1])}" \
            if self.separated and self.bracket else ""
        return f"LR50 {_g(self.lr50)} ({ci}, {self.failed} of {self.n} runs failed{sep})"


def _g(x: float) -> str:
    return f"{x:.3g}"


def _loglik(b0: float, b1: float, x: np.ndarray, y: np.ndarray) -> float:
    """Firth-penalized log-likelihood of logit p = b0 + b1 x."""
    eta = b0 + b1 * x
    ll = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
    w = np.exp(eta - 2 * np.logaddexp(0.0, eta))  # p (1 - p), computed stably
    info = np.array([[w.sum(), (w * x).sum()], [(w * x).sum(), (w * x * x).sum()]])
    det = np.linalg.det(info)
    return ll + 0.5 * math.log(det) if det > 0 else -1e300  # a singular information: never the maximum


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(b0, b1) maximizing the penalized likelihood: Newton steps on Firth's modified score, halved until the
    penalized likelihood rises."""
    b = np.zeros(2)
    X = np.stack([np.ones_like(x), x], 1)
    current = _loglik(b[0], b[1], x, y)
    for _ in range(100):
        p = 1 / (1 + np.exp(-(X @ b)))
        w = p * (1 - p)
        info = X.T @ (X * w[:, None])
        inv = np.linalg.inv(info)
        h = w * np.einsum("ij,jk,ik->i", X, inv, X)  # leverages
        step = inv @ (X.T @ (y - p + h * (0.5 - p)))
        for _ in range(30):
            new = b + step
            value = _loglik(new[0], new[1], x, y)
            if value >= current - 1e-12:
                break
            step = step / 2
        b, done = new, abs(value - current) < 1e-10 and np.abs(step).max() < 1e-8
        current = value
        if done:
            break
    return float(b[0]), float(b[1])


def _profile(x50: float, x: np.ndarray, y: np.ndarray) -> float:
    """Max over b > 0 of the penalized log-likelihood with the curve forced through (x50, 1/2)."""
    res = minimize_scalar(lambda b: -_loglik(-b * x50, b, x, y), bounds=(1e-6, MAX_SLOPE), method="bounded",
                          options={"xatol": 1e-6})
    return -float(res.fun)


def fit_failure_curve(lrs, failed) -> FailureFit:
    """The logistic failure curve of one arm from its runs: lrs[i] and whether run i failed."""
    lrs, y = np.asarray(lrs, float), np.asarray(failed, float)
    n, k = len(y), int(y.sum())
    ok_lrs, fail_lrs = lrs[y == 0], lrs[y == 1]
    separated = k > 0 and k < n and ok_lrs.max() < fail_lrs.min()
    bracket = (float(ok_lrs.max()), float(fail_lrs.min())) if separated else None
    if k == 0 or k == n:
        return FailureFit(None, None, None, False, None, n, k)
    center = float(np.log10(lrs).mean())
    x = np.log10(lrs) - center  # centred: a well-conditioned fit
    b0, b1 = _fit(x, y)
    if b1 <= 0:  # failure does not rise with the LR: no edge to speak of
        return FailureFit(None, None, b1, separated, bracket, n, k)
    x50 = -b0 / b1
    best = _loglik(b0, b1, x, y)

    def excess(t: float) -> float:
        return 2 * (best - _profile(t, x, y)) - CHI2_95

    ends = []
    for direction in (-1, 1):  # search outward half a decade at a time, up to 3 decades past the fit
        near, far = x50, x50
        for _ in range(6):
            near, far = far, far + direction * 0.5
            if excess(near) < 0 < excess(far):
                ends.append(10 ** (center + brentq(excess, *sorted((near, far)), xtol=1e-6)))
                break
        else:
            ends.append(None)  # the data do not bound LR50 on this side within 3 decades
    return FailureFit(10 ** (center + x50), (ends[0], ends[1]), b1, separated, bracket, n, k)
