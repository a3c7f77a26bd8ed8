"""The study's paired statistics against scipy's own tests and constructed data with known answers."""

import math

import numpy as np
import pytest
from scipy import stats as st

from study.paired import mean_ci, paired


def _arms(diffs, base=3.0):
    a = {s: base + d for s, d in enumerate(diffs)}
    return a, {s: base for s in range(len(diffs))}


def test_ci_equals_scipys_paired_t_test():
    rng = np.random.default_rng(0)
    a = {s: 3 + rng.normal(0, 0.05) for s in range(7)}
    b = {s: a[s] - 0.03 + rng.normal(0, 0.01) for s in range(7)}
    p = paired(a, b, margin=0.02)
    ref = st.ttest_rel([a[s] for s in range(7)], [b[s] for s in range(7)]).confidence_interval(0.95)
    assert p.n == 7 and p.ci == pytest.approx((ref.low, ref.high), rel=1e-9)


@pytest.mark.parametrize("diffs,verdict", [
    ([0.001, -0.002, 0.0015, -0.001, 0.0005], "equivalent"),  # tiny spread around 0, margin 0.02
    ([0.10, 0.12, 0.09, 0.11, 0.10], "different"),  # far outside the margin
    ([0.005, 0.006, 0.004, 0.005, 0.006], "different, within margin"),  # real but smaller than the margin
    ([0.3, -0.25, 0.1, -0.4, 0.2], "inconclusive"),  # too noisy to say either
])
def test_verdicts_on_constructed_differences(diffs, verdict):
    assert paired(*_arms(diffs), margin=0.02).verdict == verdict


def test_tost_p_value_is_the_larger_one_sided_p():
    diffs = [0.01, 0.015, 0.005, 0.012, 0.008]
    p = paired(*_arms(diffs), margin=0.02)
    lower = st.ttest_1samp(np.array(diffs) + 0.02, 0, alternative="greater").pvalue
    upper = st.ttest_1samp(np.array(diffs) - 0.02, 0, alternative="less").pvalue
    assert p.p_tost == pytest.approx(max(lower, upper), rel=1e-9)


def test_minimum_detectable_difference_has_about_80_percent_power():
    """At d = MDE the paired t test rejects about 80% of the time (noncentral t; the formula is the standard
    approximation, within a few percent for n >= 5)."""
    diffs = [0.02, -0.01, 0.03, 0.0, 0.01, -0.02]
    p = paired(*_arms(diffs), margin=0.02)
    n, sd = len(diffs), float(np.std(diffs, ddof=1))
    nc = p.mde / (sd / math.sqrt(n))
    crit = st.t.ppf(0.975, n - 1)
    power = st.nct.sf(crit, n - 1, nc) + st.nct.cdf(-crit, n - 1, nc)
    assert 0.75 < power < 0.85


def test_one_seed_and_no_common_seed():
    one = paired({0: 3.1}, {0: 3.0}, margin=0.02)
    assert one.n == 1 and one.ci is None and one.verdict == "inconclusive" and "n = 1 seed" in one.describe()
    none = paired({0: 3.1}, {1: 3.0}, margin=0.02)
    assert none.n == 0 and none.describe() == "no seed where both finished"


def test_mean_ci():
    m, ci = mean_ci([1.0, 2.0, 3.0])
    half = st.t.ppf(0.975, 2) / math.sqrt(3)  # sd = 1
    assert m == 2.0 and ci == pytest.approx((2 - half, 2 + half))
    assert mean_ci([1.0]) == (1.0, None) and mean_ci([]) == (None, None)
