"""Stability as a measured quantity: the probability that a run fails as a function of its learning
rate, and LR50, the learning rate at which half the seeds fail, with a 95% confidence interval.

    P(fail | lr) = 1 / (1 + exp(-b (log10 lr - x50))),    LR50 = 10^x50

fitted by logistic regression with Firth's penalty (the Jeffreys prior: 1/2 log det of the Fisher
information), which keeps the estimate finite under complete separation (every seed ok below some
LR, every seed failing above: the usual case on a coarse grid). The CI is the profile penalized
likelihood interval: the x50 whose profile deviance is within the chi-square(1) 95% quantile of the
maximum (Heinze & Schemper 2002; Venzon & Moolgavkar 1988). A profile is a maximum over the nuisance
parameters, taken on a grid (301 slopes, log-spaced from 1e-5 up to MAX_SLOPE; for two arms also 61
curve positions) and refined from the best grid point: a local optimizer alone lands on flat or
singular regions and returns values far below the maximum, which opens false ends.

Identified or bracketed: an arm's LR50 is a number only where at least one LR has both failed and
trained runs (mixed outcomes), >= 2 runs failed, and the edge lies inside the LRs tried (an LR where
every run trained below one where every run failed: without it, runs whose seeds share a threshold
make the fit's CI cover 0.69 where it claims 0.95, tests/lab/test_failure.py). Complete separation
(every run ok up to one LR, every run failed from the next) gives the bracket and nothing else
(`bounds`: LR50 above the largest all-trained LR, below the smallest all-failed one), whatever the
penalised fit returns: there its point estimate and CI are set by Firth's penalty, not by the data.
A ratio of two LR50s is a number where both are identified; otherwise the interval of ratios the
brackets allow, and a claim on it is decided on the brackets (`RatioFit.bracket_p`): each bracket
end is an exact binomial statement (n of n runs trained at lo: P(fail at lo) >= 1/2 has probability
<= 2^-n), so the chance that ends a statement needs are all wrong is at most the sum of their 2^-n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq, minimize, minimize_scalar
from scipy.stats import beta, chi2, norm

from lab.text import g, interval

CHI2_95 = float(chi2.ppf(0.95, 1))
CHI2_90 = float(chi2.ppf(0.90, 1))  # a one-sided 95% bound is an end of the two-sided 90% interval
MAX_SLOPE = (
    200.0  # logit per decade of LR: steeper than this is a step, the penalty keeps the fit below it
)
SLOPES = np.geomspace(1e-5, MAX_SLOPE, 301)  # the profile's grid over the slope
REACH = (
    3.0  # decades beyond the estimate an interval is searched; an end not found within it is open
)


def bounds(lrs, failed) -> tuple[float | None, float | None]:
    """(the largest LR where every run trained, below the smallest where every run failed; that
    smallest LR): LR50 lies between them whatever the curve's shape, so long as failure rises with
    the LR. None: no such LR."""
    by_lr: dict[float, list[bool]] = {}
    for lr, f in zip(lrs, failed, strict=True):
        by_lr.setdefault(float(lr), []).append(bool(f))
    all_failed = [lr for lr, fs in by_lr.items() if all(fs)]
    hi = min(all_failed) if all_failed else None
    trained = [lr for lr, fs in by_lr.items() if not any(fs) and (hi is None or lr < hi)]
    return (max(trained) if trained else None), hi


def bound_text(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"between {g(lo)} and {g(hi)}"
    if lo is not None:
        return f"> {g(lo)}"
    return f"< {g(hi)}" if hi is not None else "not bounded"


def edge_counts(lrs, failed) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """((failed, runs) at the lower bound's LR, (failed, runs) at the upper bound's LR) of
    bounds()."""
    lo, hi = bounds(lrs, failed)
    pairs = list(zip(map(float, lrs), map(bool, failed), strict=True))

    def at(lr):
        fs = [f for x, f in pairs if x == lr]
        return (sum(fs), len(fs)) if lr is not None else None

    return at(lo), at(hi)


def mixed(lrs, failed) -> bool:
    """Whether some LR has both failed and trained runs: what identifies an LR50 beyond a
    bracket."""
    by_lr: dict[float, set[bool]] = {}
    for lr, f in zip(lrs, failed, strict=True):
        by_lr.setdefault(float(lr), set()).add(bool(f))
    return any(len(v) == 2 for v in by_lr.values())


@dataclass
class FailureFit:
    """One arm's failure curve over its runs (one run = one LR and one seed)."""

    # the fitted LR50 (None: no failures, or all failures, or failure does not rise with the LR)
    lr50: float | None
    # 95% profile CI of LR50; a None end: open (beyond 3 decades)
    ci: tuple[float | None, float | None] | None
    slope: float | None  # b: logit per decade of LR
    bounds: tuple[float | None, float | None]  # what the data alone say (bounds())
    n: int  # runs
    failed: int  # of which failed
    top: float | None = None  # the highest LR tried
    mixed: bool = False  # some LR has both failed and trained runs
    ends: tuple = (None, None)  # (failed, runs) at bounds[0] and at bounds[1] (edge_counts)

    @property
    def identified(self) -> bool:
        """Mixed outcomes at some LR, >= 2 failures, and the edge inside the LRs tried (an
        all-trained LR below an all-failed one): LR50 is a number the data set, not the penalty nor
        an extrapolation."""
        return self.lr50 is not None and self.failed >= 2 and self.mixed and None not in self.bounds

    def bracket(self) -> str:
        """'0.1 < LR50 < 0.316: 0/5 then 5/5 failed' (or one-sided), what separated runs say."""
        (lo, hi), (elo, ehi) = self.bounds, self.ends
        if self.failed == 0:
            return f"LR50 > {g(self.top)}: 0/{self.n} failed"
        if lo is not None and hi is not None:
            return f"{g(lo)} < LR50 < {g(hi)}: {elo[0]}/{elo[1]} then {ehi[0]}/{ehi[1]} failed"
        if lo is not None:
            return f"LR50 > {g(lo)}: {elo[0]}/{elo[1]} failed there"
        if hi is not None:
            return f"LR50 < {g(hi)}: {ehi[0]}/{ehi[1]} failed there"
        return f"LR50 not bounded: {self.failed}/{self.n} failed"

    def describe(self) -> str:
        """The fit in one phrase, with its n: a number where identified, else the bracket the data
        give."""
        if self.identified:
            ci = interval(self.ci)
            return f"LR50 {g(self.lr50)} (95% CI {ci}, {self.failed} of {self.n} runs failed)"
        if self.failed == 0:
            return f"{self.bracket()} (no run failed: a bound, not an estimate)"
        why = (
            "fewer than 2 failures"
            if self.failed < 2
            else "no LR with both outcomes"
            if not self.mixed
            else "the edge is not inside the LRs tried"
        )
        return f"{self.bracket()} ({why}: a bracket, not an estimate)"


def _design(x: np.ndarray, arm: np.ndarray | None = None) -> np.ndarray:
    cols = [np.ones_like(x), x] + ([arm] if arm is not None else [])
    return np.stack(cols, 1)


def _softplus(eta: np.ndarray) -> np.ndarray:
    """log(1 + e^eta), stably (np.logaddexp(0, eta) to the last bit or two, ~2x faster)."""
    return np.maximum(eta, 0.0) + np.log1p(np.exp(-np.abs(eta)))


def _penalized(beta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Firth-penalized log-likelihood log L + 1/2 log det I(beta) of logit p = X beta, for one beta
    (p,) or many (m, p) at once; -inf where the information is singular (never the maximum)."""
    if np.ndim(beta) == 1:  # one beta: X^T diag(w) X without the (n, k, k) outer products
        eta = X @ beta
        soft = _softplus(eta)
        w = np.exp(eta - 2 * soft)  # p (1 - p), computed stably
        with np.errstate(divide="ignore", invalid="ignore"):
            sign, logdet = np.linalg.slogdet((X * w[:, None]).T @ X)
        return float(np.sum(y * eta - soft) + 0.5 * logdet) if sign > 0 else -np.inf
    B = np.atleast_2d(beta)
    eta = B @ X.T  # (m, n)
    soft = _softplus(eta)
    ll = np.sum(y * eta - soft, axis=1)
    w = np.exp(eta - 2 * soft)  # p (1 - p), computed stably
    w[w < 1e-250] = 0.0  # subnormal weights add nothing to the sum and make the product ~5x slower
    k = X.shape[1]
    # sum_n w x x^T
    info = (w @ (X[:, :, None] * X[:, None, :]).reshape(len(X), k * k)).reshape(-1, k, k)
    with np.errstate(divide="ignore", invalid="ignore"):  # singular where every p is 0 or 1: -inf
        sign, logdet = np.linalg.slogdet(info)
    out = np.where(sign > 0, ll + 0.5 * logdet, -np.inf)
    return out if np.ndim(beta) == 2 else float(out[0])


def _loglik(b0: float, b1: float, x: np.ndarray, y: np.ndarray) -> float:
    """Firth-penalized log-likelihood of logit p = b0 + b1 x (one arm)."""
    return _penalized(np.array([b0, b1]), _design(x), y)


def _newton(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """beta maximizing the penalized likelihood: Newton steps on Firth's modified score, halved
    until the penalized likelihood rises."""
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
    b0, b1 = _newton(_design(x), y)
    return float(b0), float(b1)


def _max_over_slope(beta_of, X: np.ndarray, y: np.ndarray) -> float:
    """max over b in (0, MAX_SLOPE] of the penalized log-likelihood at beta_of(b) (an (m,) -> (m, p)
    map): the best of a log-spaced grid, then refined between its neighbours."""
    values = _penalized(beta_of(SLOPES), X, y)
    i = int(np.argmax(values))
    best = float(values[i])
    lo, hi = math.log(SLOPES[max(i - 1, 0)]), math.log(SLOPES[min(i + 1, len(SLOPES) - 1)])
    res = minimize_scalar(
        lambda t: -_penalized(beta_of(np.array([math.exp(t)])), X, y)[0],
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-7},
    )
    return max(best, -float(res.fun)) if np.isfinite(res.fun) else best


def _profile(x50: float, x: np.ndarray, y: np.ndarray) -> float:
    """Max over b > 0 of the penalized log-likelihood with the curve forced through (x50, 1/2)."""
    return _max_over_slope(lambda b: np.stack([-b * x50, b], 1), _design(x), y)


def _profile_at(e0: float, x0: float, x: np.ndarray, y: np.ndarray) -> float:
    """Max over b > 0 of the penalized log-likelihood with logit P(fail) at x0 forced to e0."""
    return _max_over_slope(lambda b: np.stack([e0 - b * x0, b], 1), _design(x), y)


def _interval(estimate: float, excess, reach: float = REACH) -> tuple[float | None, float | None]:
    """The ends of {t: excess(t) < 0} around `estimate` (excess < 0 there): each side scanned
    outward in 0.05-decade steps up to `reach` decades, the first crossing refined by bisection;
    None where none is found."""
    ends = []
    for direction in (-1, 1):
        near, found = estimate, None
        for k in range(1, int(round(reach / 0.05)) + 1):
            far = estimate + direction * 0.05 * k
            if excess(far) > 0:
                found = (
                    brentq(excess, *sorted((near, far)), xtol=1e-6) if excess(near) < 0 else near
                )
                break
            near = far
        ends.append(found)
    return ends[0], ends[1]


def fit_failure_curve(lrs, failed) -> FailureFit:
    """The logistic failure curve of one arm from its runs: lrs[i] and whether run i failed."""
    lrs, y = np.asarray(lrs, float), np.asarray(failed, float)
    n, k = len(y), int(y.sum())
    edge = bounds(lrs, y)
    top = float(lrs.max()) if n else None
    both, ends = mixed(lrs, y), edge_counts(lrs, y)
    if k == 0 and n:  # nothing failed: the lower end is the highest LR tried
        ends = ((0, int((lrs == top).sum())), None)
    if k == 0 or k == n or len(set(lrs.tolist())) < 2:
        return FailureFit(None, None, None, edge, n, k, top, both, ends)
    center = float(np.log10(lrs).mean())
    x = np.log10(lrs) - center  # centred: a well-conditioned fit
    b0, b1 = _fit(x, y)
    # failure does not rise with the LR: no edge to speak of
    if b1 <= SLOPES[0] or abs(b0 / b1) > 10:
        return FailureFit(None, None, b1, edge, n, k, top, both, ends)
    x50 = -b0 / b1
    best = max(_loglik(b0, b1, x, y), _profile(x50, x, y))

    def excess(t: float) -> float:
        return 2 * (best - _profile(t, x, y)) - CHI2_95

    lo, hi = _interval(x50, excess)
    ci = tuple(None if e is None else 10 ** (center + e) for e in (lo, hi))
    return FailureFit(10 ** (center + x50), ci, b1, edge, n, k, top, both, ends)


def p_fail_at(lrs, failed, lr: float) -> float:
    """The fitted P(fail) at `lr` from one arm's runs (Firth logistic in log10 LR, its point
    estimate): 0 where none failed, 1 where all did, the failed share at the LRs tried where only
    one LR was."""
    lrs, y = np.asarray(lrs, float), np.asarray(failed, float)
    if len(y) == 0 or y.sum() == 0:
        return 0.0
    if y.sum() == len(y):
        return 1.0
    if len(set(lrs.tolist())) < 2:
        return float(y.mean())
    center = float(np.log10(lrs).mean())
    b0, b1 = _fit(np.log10(lrs) - center, y)
    return float(1 / (1 + math.exp(-(b0 + b1 * (math.log10(lr) - center)))))


def p_fail_upper(lrs, failed, lr: float) -> float:
    """The one-sided upper 95% profile bound of P(fail) at `lr` from one arm's runs (1.0 where the
    data do not bound it below 1 within the search)."""
    lrs, y = np.asarray(lrs, float), np.asarray(failed, float)
    if len(y) == 0:
        return 1.0
    # no slope to fit: the exact binomial bound of the runs at or above `lr`
    if len(set(lrs.tolist())) < 2:
        at = y[lrs >= lr]
        return (
            1.0
            if len(at) == 0
            else float(beta.ppf(0.95, at.sum() + 1, len(at) - at.sum()))
            if at.sum() < len(at)
            else 1.0
        )
    center = float(np.log10(lrs).mean())
    x, x0 = np.log10(lrs) - center, math.log10(lr) - center
    X = _design(x)
    try:
        b0, b1 = _newton(X, y)
    except np.linalg.LinAlgError:
        b0, b1 = 0.0, 0.0
    e_hat = b0 + b1 * x0 if b1 > 0 else None
    best = max(
        _penalized(np.array([b0, b1]), X, y) if b1 > 0 else -np.inf,
        max(_profile_at(e, x0, x, y) for e in (-20.0, -10.0, -5.0, -2.0, 0.0)),
    )
    if e_hat is None:  # start from the best of a coarse scan
        scan = np.linspace(-30, 10, 81)
        e_hat = float(scan[int(np.argmax([_profile_at(e, x0, x, y) for e in scan]))])
        best = max(best, _profile_at(e_hat, x0, x, y))

    def excess(e: float) -> float:
        return 2 * (best - _profile_at(e, x0, x, y)) - CHI2_90

    for step in range(1, 401):  # logit steps of 0.1 up to +40
        if excess(e_hat + 0.1 * step) > 0:
            upper = brentq(excess, e_hat + 0.1 * (step - 1), e_hat + 0.1 * step, xtol=1e-6)
            return float(1 / (1 + math.exp(-upper)))
    return 1.0


@dataclass
class RatioFit:
    """Two arms' failure curves fitted together with one slope: logit P(fail) = b0 + b1 (log10 lr -
    r [arm A]), so r = log10(LR50_A / LR50_B)."""

    ratio: float | None  # LR50_A / LR50_B, fitted; None: nothing to fit
    ci: tuple[float | None, float | None] | None  # 95% profile-likelihood CI; a None end: open
    p: float | None  # likelihood-ratio test of ratio = 1 (chi-square, 1 df)
    n: int
    failed: int
    identified: bool = False  # both arms' LR50 identified: the ratio is a number the data set
    # what the arms' brackets say of the ratio
    bounds: tuple[float | None, float | None] = (None, None)
    profile: object = None  # r -> profile penalized log-likelihood (for equivalence tests)
    best: float | None = None  # its maximum
    # runs behind bounds[0] (A's lower end, B's upper) and bounds[1] (A's upper, B's lower)
    ends: tuple = (None, None)
    level: float = 0.95  # the interval's confidence (widened after adaptive stopping: widen)

    def describe(self) -> str:
        if self.identified:
            return (
                f"LR50 ratio {g(self.ratio)} ({self.level:.3g} CI {interval(self.ci)}, "
                "likelihood-ratio p = "
                f"{self.p:.2g}, "
                f"{self.n} runs, {self.failed} failed)"
            )
        test = f"likelihood-ratio p = {self.p:.2g}, " if self.p is not None else ""
        return (
            f"LR50 ratio {bound_text(*self.bounds)} (an arm's LR50 is only bracketed: no estimate; "
            f"{test}"
            f"{self.n} runs, {self.failed} failed)"
        )

    def bracket_p(
        self, at_least: float | None = None, at_most: float | None = None
    ) -> float | None:
        """p that the brackets wrongly show at_least <= ratio <= at_most (sum of 2^-n over the
        bracket ends the statement needs; see the module docstring); None where the brackets do not
        show it."""
        p = 0.0
        for want, bound, end, shown in (
            (at_least, self.bounds[0], self.ends[0], lambda b, w: b >= w),
            (at_most, self.bounds[1], self.ends[1], lambda b, w: b <= w),
        ):
            if want is None:
                continue
            if bound is None or end is None or not shown(bound, want):
                return None
            p += sum(2.0**-n for n in end)
        return min(1.0, p)

    def signed_root(self, r0: float) -> float:
        """sign(r_hat - r0) sqrt(profile deviance at r0): ~N(0, 1) at the true r (one-sided tests of
        r)."""
        dev = max(0.0, 2 * (self.best - self.profile(r0)))
        return math.copysign(math.sqrt(dev), math.log10(self.ratio) - r0)

    def within(self, factor: float) -> tuple[float, float]:
        """(p of TOST that the ratio lies within [1/factor, factor], p that it lies outside):
        one-sided signed-root tests at both ends of the margin (1.0 when the ratio is not
        identified)."""
        if not self.identified:
            return 1.0, 1.0
        m = math.log10(factor)
        z_lo, z_hi = self.signed_root(-m), self.signed_root(m)
        p_lo, p_hi = float(norm.sf(z_lo)), float(norm.cdf(z_hi))  # H0 r <= -m; H0 r >= m
        return max(p_lo, p_hi), min(float(norm.cdf(z_lo)), float(norm.sf(z_hi)))


def _profile_ratio(r: float, X: np.ndarray, y: np.ndarray, z_range: tuple[float, float]) -> float:
    """Max over (b0, b1 > 0) of the penalized log-likelihood with the arm offset forced to c = -r
    b1: on a grid of slopes x curve positions z50 (b0 = -b1 z50), then Nelder-Mead from the best
    grid point."""
    z50 = np.linspace(z_range[0], z_range[1], 61)
    b1 = SLOPES[::4]
    B1, Z = np.meshgrid(b1, z50, indexing="ij")
    betas = np.stack([-(B1 * Z).ravel(), B1.ravel(), -r * B1.ravel()], 1)
    values = _penalized(betas, X, y)
    i = int(np.argmax(values))
    best, start = float(values[i]), np.array([math.log(betas[i, 1]), -betas[i, 0] / betas[i, 1]])

    def neg(v):
        b = math.exp(v[0])
        return -_penalized(np.array([-b * v[1], b, -r * b]), X, y) if b <= MAX_SLOPE else np.inf

    res = minimize(
        neg, start, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-10, "maxiter": 2000}
    )
    return max(best, -float(res.fun)) if np.isfinite(res.fun) else best


def _best(x: np.ndarray, arm: np.ndarray, y: np.ndarray) -> float:
    """The maximized penalized log-likelihood of logit p = b0 + b1 x (+ c arm where arm varies)."""
    X = _design(x - x.mean(), arm if arm.any() else None)
    return _penalized(_newton(X, y), X, y)


def lr50_ratio(lrs_a, failed_a, lrs_b, failed_b, ci: bool = True) -> RatioFit:
    """LR50 of arm A over LR50 of arm B from both arms' runs (lrs, failed per run); see RatioFit.
    ci=False skips the interval (the tests need only the profile: the adaptive stage's looks)."""
    lrs = np.log10(np.concatenate([np.asarray(lrs_a, float), np.asarray(lrs_b, float)]))
    y = np.concatenate([np.asarray(failed_a, float), np.asarray(failed_b, float)])
    arm = np.concatenate([np.ones(len(lrs_a)), np.zeros(len(lrs_b))])
    n, k = len(y), int(y.sum())
    fa, fb = fit_failure_curve(lrs_a, failed_a), fit_failure_curve(lrs_b, failed_b)
    (alo, ahi), (blo, bhi) = fa.bounds, fb.bounds
    if fa.failed == 0:
        alo = fa.top
    if fb.failed == 0:
        blo = fb.top
    ratio_bounds = (alo / bhi if alo and bhi else None, ahi / blo if ahi and blo else None)

    def runs(*ends):
        return None if None in ends else tuple(e[1] for e in ends)

    ends = (runs(fa.ends[0], fb.ends[1]), runs(fa.ends[1], fb.ends[0]))
    if k == 0 or k == n or len(set(lrs)) < 2:  # nothing to fit: one outcome, or one LR (no slope)
        return RatioFit(None, None, None, n, k, False, ratio_bounds, ends=ends)
    x = lrs - lrs.mean()
    X = _design(x, arm)
    b0, b1, c = _newton(X, y)
    # no rising edge to place the arms on: the LR test of one curve only
    if b1 <= SLOPES[0] or abs(c / b1) > 10:
        p = float(chi2.sf(max(0.0, 2 * (_best(lrs, arm, y) - _best(lrs, 0 * arm, y))), 1))
        return RatioFit(None, None, p, n, k, False, ratio_bounds, ends=ends)
    r = -c / b1
    z_range = (float(x.min()) - 2.0, float(x.max()) + 2.0)

    def profile(t: float) -> float:
        return _profile_ratio(t, X, y, z_range)

    best = max(_penalized(np.array([b0, b1, c]), X, y), profile(r))

    def excess(t: float) -> float:
        return 2 * (best - profile(t)) - CHI2_95

    lo, hi = _interval(r, excess) if ci else (None, None)
    p = float(chi2.sf(max(0.0, 2 * (best - profile(0.0))), 1))  # likelihood-ratio test of ratio = 1
    identified = fa.identified and fb.identified
    return RatioFit(
        10**r,
        tuple(None if e is None else 10**e for e in (lo, hi)),
        p,
        n,
        k,
        identified,
        ratio_bounds,
        profile,
        best,
        ends,
    )


def widen(r: RatioFit, level: float) -> RatioFit:
    """r with its profile-likelihood interval at confidence `level` (the chi-square quantile at it)
    instead of 95%: a claim whose p is multiplied by its looks prints the matching interval,
    1 - alpha / looks (Bonferroni), never a plain 95%."""
    if r.profile is None or r.ratio is None or r.best is None:
        return replace(r, level=level)
    q = float(chi2.ppf(level, 1))
    ends = _interval(math.log10(r.ratio), lambda t: 2 * (r.best - r.profile(t)) - q)
    ci = tuple(None if e is None else 10**e for e in ends)
    return replace(r, ci=ci, level=level)


def lr50_test(r: RatioFit, expect: str, ratio_margin: float) -> tuple:
    """(raw p, the direction it points to, a note where the runs cannot test it) of an LR50
    claim: TOST at [1/m, m] for `same` where both LR50s are identified, else the brackets' exact
    bound; the likelihood-ratio test for a direction."""
    if expect == "same":
        if r.identified:
            p_in, p_out = r.within(ratio_margin)
            return (p_in, "same", None) if p_in <= p_out else (p_out, "different", None)
        inside = r.bracket_p(1 / ratio_margin, ratio_margin)
        outside = [
            p
            for p in (r.bracket_p(at_least=ratio_margin), r.bracket_p(at_most=1 / ratio_margin))
            if p is not None
        ]
        if inside is not None:
            return inside, "same", None
        if outside:
            return min(outside), "different", None
        return (
            None,
            None,
            f"an arm's LR50 is only bracketed and the brackets allow ratios "
            f"{bound_text(*r.bounds).replace('between ', '')}, inside and outside "
            f"[1/{ratio_margin:g}, {ratio_margin:g}]: decided on the brackets, not on a "
            f"penalised estimate",
        )
    lo, hi = r.bounds
    if r.identified:
        return r.p, ("higher" if r.ratio > 1 else "lower"), None
    # a bracket end is a strict statement (all runs trained at lo: LR50 > lo; all failed at hi:
    # LR50 < hi), so brackets that meet at one LR, where one arm's runs all trained and the
    # other's all failed, order the arms: a ratio bound of exactly 1 orders them too
    if lo is not None and lo >= 1:
        return r.p, "higher", None
    if hi is not None and hi <= 1:
        return r.p, "lower", None
    return r.p, None, "an arm's LR50 is only bounded and the bounds do not order the arms"
