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

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import chi2

from study.text import g, interval

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
    top: float | None = None  # the highest LR tried

    def describe(self) -> str:
        """The fit in one phrase, with its n."""
        if self.lr50 is None and self.failed == 0 and self.top is not None:
            return f"no run failed up to lr {g(self.top)} ({self.n} runs): LR50 above it"
        if self.lr50 is None:
            return f"no LR50 ({self.failed} of {self.n} runs failed)"
        ci = f"95% CI {interval(self.ci or (None, None))}"
        sep = f"; complete separation between lr {g(self.bracket[0])} and {g(self.bracket[1])}" \
            if self.separated and self.bracket else ""
        return f"LR50 {g(self.lr50)} ({ci}, {self.failed} of {self.n} runs failed{sep})"


def _penalized(beta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """Firth-penalized log-likelihood of logit p = X beta: log L + 1/2 log det I(beta)."""
    eta = X @ beta
    ll = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
    w = np.exp(eta - 2 * np.logaddexp(0.0, eta))  # p (1 - p), computed stably
    sign, logdet = np.linalg.slogdet(X.T @ (X * w[:, None]))
    return ll + 0.5 * logdet if sign > 0 else -1e300  # a singular information: never the maximum


def _loglik(b0: float, b1: float, x: np.ndarray, y: np.ndarray) -> float:
    """Firth-penalized log-likelihood of logit p = b0 + b1 x (one arm)."""
    return _penalized(np.array([b0, b1]), np.stack([np.ones_like(x), x], 1), y)


def _newton(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """beta maximizing the penalized likelihood: Newton steps on Firth's modified score, halved until the
    penalized likelihood rises."""
    b = np.zeros(X.shape[1])
    current = _penalized(b, X, y)
    for _ in range(100):
        p = 1 / (1 + np.exp(-(X @ b)))
        w = p * (1 - p)
        inv = np.linalg.inv(X.T @ (X * w[:, None]))
        h = w * np.einsum("ij,jk,ik->i", X, inv, X)  # leverages
        step = inv @ (X.T @ (y - p + h * (0.5 - p)))
        for _ in range(30):
            new = b + step
            value = _penalized(new, X, y)
            if value >= current - 1e-12:
                break
            step = step / 2
        b, done = new, abs(value - current) < 1e-10 and np.abs(step).max() < 1e-8
        current = value
        if done:
            break
    return b


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(b0, b1) of one arm's curve logit p = b0 + b1 x."""
    b0, b1 = _newton(np.stack([np.ones_like(x), x], 1), y)
    return float(b0), float(b1)


def _profile(x50: float, x: np.ndarray, y: np.ndarray) -> float:
    """Max over b > 0 of the penalized log-likelihood with the curve forced through (x50, 1/2)."""
    res = minimize_scalar(lambda b: -_loglik(-b * x50, b, x, y), bounds=(1e-6, MAX_SLOPE), method="bounded",
                          options={"xatol": 1e-6})
    return -float(res.fun)


def _interval(estimate: float, excess) -> tuple[float | None, float | None]:
    """The ends of {t: excess(t) < 0} around `estimate` (excess < 0 there): searched outward half a decade at a
    time up to 3 decades; None where the data do not bound it within that."""
    ends = []
    for direction in (-1, 1):
        near, far = estimate, estimate
        for _ in range(6):
            near, far = far, far + direction * 0.5
            if excess(near) < 0 < excess(far):
                ends.append(brentq(excess, *sorted((near, far)), xtol=1e-6))
                break
        else:
            ends.append(None)
    return ends[0], ends[1]


def fit_failure_curve(lrs, failed) -> FailureFit:
    """The logistic failure curve of one arm from its runs: lrs[i] and whether run i failed."""
    lrs, y = np.asarray(lrs, float), np.asarray(failed, float)
    n, k = len(y), int(y.sum())
    ok_lrs, fail_lrs = lrs[y == 0], lrs[y == 1]
    separated = k > 0 and k < n and ok_lrs.max() < fail_lrs.min()
    bracket = (float(ok_lrs.max()), float(fail_lrs.min())) if separated else None
    top = float(lrs.max()) if n else None
    if k == 0 or k == n or len(set(lrs.tolist())) < 2:
        return FailureFit(None, None, None, False, None, n, k, top)
    center = float(np.log10(lrs).mean())
    x = np.log10(lrs) - center  # centred: a well-conditioned fit
    b0, b1 = _fit(x, y)
    if b1 <= 0:  # failure does not rise with the LR: no edge to speak of
        return FailureFit(None, None, b1, separated, bracket, n, k, top)
    x50 = -b0 / b1
    best = _loglik(b0, b1, x, y)

    def excess(t: float) -> float:
        return 2 * (best - _profile(t, x, y)) - CHI2_95

    lo, hi = _interval(x50, excess)
    ci = tuple(None if e is None else 10 ** (center + e) for e in (lo, hi))
    return FailureFit(10 ** (center + x50), ci, b1, separated, bracket, n, k, top)


@dataclass
class RatioFit:
    """Two arms' failure curves fitted together with one slope: logit P(fail) = b0 + b1 (log10 lr - r [arm A]), so
    r = log10(LR50_A / LR50_B)."""

    ratio: float | None  # LR50_A / LR50_B; None: no run of either arm failed, or failure does not rise with the LR
    ci: tuple[float | None, float | None] | None  # 95% profile-likelihood CI; a None end: beyond x 10^3
    p: float | None  # likelihood-ratio test of ratio = 1 (chi-square, 1 df)
    n: int
    failed: int

    def describe(self) -> str:
        if self.ratio is None and self.ci is not None:  # each arm had one outcome: the data give a bound only
            lo, hi = self.ci
            bound = f"below {g(hi)} (A failed at every LR, B at none)" if hi else \
                f"above {g(lo)} (A failed at no LR, B at every one)"
            return f"LR50 ratio {bound}; likelihood-ratio p = {self.p:.2g}, n = {self.n} runs, {self.failed} failed"
        if self.ratio is None:
            return f"no LR50 ratio ({self.failed} of {self.n} runs failed)"
        return (f"LR50 ratio {g(self.ratio)} (95% CI {interval(self.ci)}, p = {self.p:.2g}, n = {self.n} runs, "
                f"{self.failed} failed)")


def _profile_ratio(r: float, X: np.ndarray, y: np.ndarray, start: np.ndarray) -> float:
    """Max over (b0, b1) of the penalized log-likelihood with the arm offset forced to c = -r b1."""
    from scipy.optimize import minimize

    def neg(v):
        return -_penalized(np.array([v[0], v[1], -r * v[1]]), X, y) if v[1] > 0 else 1e300

    res = minimize(neg, start, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-9, "maxiter": 2000})
    return -float(res.fun)


def _best(x: np.ndarray, arm: np.ndarray, y: np.ndarray) -> float:
    """The maximized penalized log-likelihood of logit p = b0 + b1 x (+ c arm where arm varies)."""
    cols = [np.ones_like(x), x - x.mean()] + ([arm] if arm.any() else [])
    X = np.stack(cols, 1)
    return _penalized(_newton(X, y), X, y)


def lr50_ratio(lrs_a, failed_a, lrs_b, failed_b) -> RatioFit:
    """LR50 of arm A over LR50 of arm B from both arms' runs (lrs, failed per run); see RatioFit."""
    lrs = np.log10(np.concatenate([np.asarray(lrs_a, float), np.asarray(lrs_b, float)]))
    y = np.concatenate([np.asarray(failed_a, float), np.asarray(failed_b, float)])
    arm = np.concatenate([np.ones(len(lrs_a)), np.zeros(len(lrs_b))])
    n, k = len(y), int(y.sum())
    if k == 0 or k == n or len(set(lrs)) < 2:  # nothing to fit: one outcome, or one LR (no slope)
        return RatioFit(None, None, None, n, k)
    ya, yb = y[arm == 1], y[arm == 0]
    la, lb = lrs[arm == 1], lrs[arm == 0]
    if ya.sum() in (0, len(ya)) and yb.sum() in (0, len(yb)):  # each arm one outcome: only a bound
        p = float(chi2.sf(max(0.0, 2 * (_best(lrs, arm, y) - _best(lrs, 0 * arm, y))), 1))  # LR test of ratio 1
        if ya.sum() == len(ya) and yb.sum() == 0:  # A failed everywhere, B nowhere
            return RatioFit(None, (None, 10 ** (la.min() - lb.max())), p, n, k)
        if ya.sum() == 0 and yb.sum() == len(yb):
            return RatioFit(None, (10 ** (la.max() - lb.min()), None), p, n, k)
    x = lrs - lrs.mean()
    X = np.stack([np.ones_like(x), x, arm], 1)
    b0, b1, c = _newton(X, y)
    if b1 <= 0:
        return RatioFit(None, None, None, n, k)
    r = -c / b1
    best = _penalized(np.array([b0, b1, c]), X, y)
    start = np.array([b0, b1])

    def excess(t: float) -> float:
        return 2 * (best - _profile_ratio(t, X, y, start)) - CHI2_95

    lo, hi = _interval(r, excess)
    # an arm without failures (or without successes) bounds the ratio on one side only: Firth's penalty would
    # close the other end, but at a distance the data do not set
    if ya.sum() == 0 or yb.sum() == len(yb):
        hi = None
    if yb.sum() == 0 or ya.sum() == len(ya):
        lo = None
    p = float(chi2.sf(max(0.0, 2 * (best - _profile_ratio(0.0, X, y, start))), 1))  # LR test of ratio = 1
    return RatioFit(10 ** r, tuple(None if e is None else 10 ** e for e in (lo, hi)), p, n, k)
