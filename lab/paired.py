"""Paired comparisons of two arms over seeds: runs that differ only in the arm share seed, init and
batches, so the comparison uses the per-seed differences d_s = L_A(s) - L_B(s).

- mean difference and its 95% CI, t with n - 1 degrees of freedom;
- a verdict by two one-sided tests (TOST, alpha = 0.05, i.e. the 90% CI inside +-margin) and the 95%
  CI: `equivalent` (TOST passes, the CI contains 0), `different` (the 95% CI excludes 0; `different,
  within +-m` when TOST passes too: a real difference smaller than the margin), otherwise
  `inconclusive`;
- the minimum detectable difference at 80% power (two-sided alpha = 0.05) for this n and the
  observed spread: the delta at which the paired t test's power, from the noncentral t with n - 1 df
  and noncentrality delta / (sd / sqrt(n)), is 0.8 (the normal-style shortcut (t_{0.975} + t_{0.8})
  sd / sqrt(n) is 16% low at n = 2);
- the two-sided p of the paired t test (H0: no difference), for a multiplicity correction over a
  study's claims (holm()).
One seed (n = 1) has no spread: the verdict is `inconclusive` and the CI and MDE are None.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats as st
from scipy.optimize import brentq

ALPHA, POWER = 0.05, 0.8


@dataclass
class Paired:
    n: int
    mean: float | None  # mean of d_s = A - B
    ci: tuple[float, float] | None  # 95%
    verdict: str
    margin: float
    mde: float | None  # minimum detectable |difference| at 80% power
    p_tost: float | None
    p_diff: float | None = None  # two-sided paired t test of no difference

    def describe(self) -> str:
        """One sentence fragment: 'A - B = +0.012 nats (95% CI -0.004..+0.028, n = 5 seeds):
        equivalent within +-0.02 (TOST p = 0.03); MDE 0.025'."""
        if self.n == 0:
            return "no seed where both runs trained"
        if self.ci is None:
            return (
                f"{self.mean:+.3f} nats from n = 1 seed: inconclusive (no spread to test against)"
            )
        verdict = {
            "equivalent": f"equivalent within +-{self.margin:g}",
            "different, within margin": f"different, but within +-{self.margin:g}",
        }.get(self.verdict, self.verdict)
        return (
            f"{self.mean:+.3f} nats (95% CI {self.ci[0]:+.3f}..{self.ci[1]:+.3f}, n = {self.n} "
            f"seeds): {verdict} "
            f"(TOST p = {self.p_tost:.3g}); minimum detectable difference at 80% power "
            f"{self.mde:.3f}"
        )


def paired(a: dict, b: dict, margin: float) -> Paired:
    """Compare arm A with arm B over the seeds both have ({seed: value}); see the module
    docstring."""
    seeds = sorted(set(a) & set(b))
    d = [a[s] - b[s] for s in seeds]
    n = len(d)
    if n < 2:
        return Paired(n, d[0] if d else None, None, "inconclusive", margin, None, None)
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    df = n - 1
    t_ci = st.t.ppf(1 - ALPHA / 2, df)
    se = sd / math.sqrt(n)
    if se == 0:  # identical differences: the CI is the point itself
        ci, p_lower, p_upper = (mean, mean), float(mean <= -margin), float(mean >= margin)
        p_diff = 1.0 if mean == 0 else 0.0
    else:
        ci = (mean - t_ci * se, mean + t_ci * se)
        p_lower = st.t.sf((mean + margin) / se, df)  # H0: d <= -margin
        p_upper = st.t.cdf((mean - margin) / se, df)  # H0: d >= +margin
        p_diff = float(2 * st.t.sf(abs(mean) / se, df))
    p_tost = max(p_lower, p_upper)
    equivalent = p_tost < ALPHA
    excludes_zero = ci[0] > 0 or ci[1] < 0
    if excludes_zero:
        verdict = "different, within margin" if equivalent else "different"
    else:
        verdict = "equivalent" if equivalent else "inconclusive"
    return Paired(n, mean, ci, verdict, margin, detectable(sd, n), p_tost, p_diff)


def power(delta: float, sd: float, n: int) -> float:
    """Power of the two-sided paired t test (alpha 0.05) to detect a true mean difference delta with
    n seeds at per-seed sd: P(|T| > t_crit), T noncentral t with n - 1 df and noncentrality delta /
    (sd / sqrt(n))."""
    df, crit = n - 1, st.t.ppf(1 - ALPHA / 2, n - 1)
    nc = delta / (sd / math.sqrt(n))
    # the far tail; scipy returns NaN where it underflows (df = 1)
    lower = st.nct.cdf(-crit, df, nc)
    return float(st.nct.sf(crit, df, nc) + (0.0 if math.isnan(lower) else lower))


def detectable(sd: float, n: int) -> float:
    """The minimum detectable |difference| at 80% power for n seeds at per-seed sd (noncentral
    t)."""
    if sd == 0:
        return 0.0
    se = sd / math.sqrt(n)
    hi = 1.0
    # bracket the noncentrality (scipy's nct turns NaN far out)
    while power(hi * se, sd, n) < POWER:
        hi *= 2
    nc = brentq(lambda c: power(c * se, sd, n) - POWER, hi / 2 if hi > 1 else 0.0, hi)
    return nc * se


def _fewest(power_at, most: int) -> int | None:
    """The fewest n >= 2 with power_at(n) >= 80% (power rises with n); None beyond `most`."""
    lo, hi = 2, 2
    while power_at(hi) < POWER:
        lo, hi = hi, hi * 2
        if hi > most:
            return None
    while lo < hi:  # bisect for the first n that reaches 80%
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if power_at(mid) < POWER else (lo, mid)
    return lo


def seeds_needed(delta: float, sd: float, most: int = 100_000) -> int | None:
    """The fewest seeds (>= 2) at which the paired t test has 80% power for a true difference delta
    at per-seed sd (what a margin costs at a pilot's spread); None beyond `most`."""
    return _fewest(lambda n: power(delta, sd, n), most) if delta > 0 else None


def tost_power(margin: float, sd: float, n: int) -> float:
    """Power of TOST (alpha 0.05 each side) to show equivalence within +-margin when the true
    difference is 0: both one-sided tests must reject, P(|T + nc| ... ) ~ 1 - 2 P(T_nc < t_0.95)
    with T_nc noncentral t, n - 1 df and noncentrality margin / (sd / sqrt(n)) (the two rejections
    are nearly exclusive failures)."""
    df = n - 1
    nc = margin / (sd / math.sqrt(n))
    return max(0.0, 1 - 2 * float(st.nct.cdf(st.t.ppf(1 - ALPHA, df), df, nc)))


def tost_seeds_needed(margin: float, sd: float, most: int = 100_000) -> int | None:
    """The fewest seeds (>= 2) at which TOST at +-margin has 80% power for a true difference of 0 at
    per-seed sd (what a margin costs at a pilot's spread); None beyond `most`."""
    return _fewest(lambda n: tost_power(margin, sd, n), most) if margin > 0 and sd > 0 else None


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control over a study's primary tests),
    in the input order: the i-th smallest p times (m - i), made monotone, capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def mean_ci(values: list[float]) -> tuple[float | None, tuple[float, float] | None]:
    """(mean, 95% t CI) of per-seed values; the CI is None for fewer than 2."""
    if not values:
        return None, None
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, None
    half = (
        st.t.ppf(1 - ALPHA / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    )
    return m, (m - half, m + half)
