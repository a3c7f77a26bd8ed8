"""The study's paired statistics against scipy's own tests and constructed data with known
answers."""

import math

import numpy as np
import pytest
from scipy import stats as st

from lab.paired import holm, mean_ci, paired, power, seeds_needed


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


@pytest.mark.parametrize(
    "diffs,verdict",
    [
        # tiny spread around 0, margin 0.02
        ([0.001, -0.002, 0.0015, -0.001, 0.0005], "equivalent"),
        ([0.10, 0.12, 0.09, 0.11, 0.10], "different"),  # far outside the margin
        # real but smaller than the margin
        ([0.005, 0.006, 0.004, 0.005, 0.006], "different, within margin"),
        ([0.3, -0.25, 0.1, -0.4, 0.2], "inconclusive"),  # too noisy to say either
    ],
)
def test_verdicts_on_constructed_differences(diffs, verdict):
    assert paired(*_arms(diffs), margin=0.02).verdict == verdict


def test_tost_p_value_is_the_larger_one_sided_p():
    diffs = [0.01, 0.015, 0.005, 0.012, 0.008]
    p = paired(*_arms(diffs), margin=0.02)
    lower = st.ttest_1samp(np.array(diffs) + 0.02, 0, alternative="greater").pvalue
    upper = st.ttest_1samp(np.array(diffs) - 0.02, 0, alternative="less").pvalue
    assert p.p_tost == pytest.approx(max(lower, upper), rel=1e-9)


def test_minimum_detectable_difference_has_80_percent_power():
    """At d = MDE the paired t test rejects 80% of the time: power from scipy's noncentral t,
    computed here independently of lab/paired.py. The normal-style shortcut (t_0.975 + t_0.8) sd /
    sqrt(n) was 16% low at n = 2."""
    diffs = [0.02, -0.01, 0.03, 0.0, 0.01, -0.02]
    for d in (diffs, diffs[:2], diffs[:3]):
        p = paired(*_arms(d), margin=0.02)
        n, sd = len(d), float(np.std(d, ddof=1))
        nc = p.mde / (sd / math.sqrt(n))
        crit = st.t.ppf(0.975, n - 1)
        lower = st.nct.cdf(-crit, n - 1, nc)  # NaN where scipy underflows: a tail of ~0
        assert st.nct.sf(crit, n - 1, nc) + np.nan_to_num(lower) == pytest.approx(0.8, abs=1e-6)
    shortcut = (st.t.ppf(0.975, 1) + st.t.ppf(0.8, 1)) * sd / math.sqrt(2)
    assert (
        0.10
        < paired(*_arms(diffs[:2]), margin=0.02).mde
        / (
            (st.t.ppf(0.975, 1) + st.t.ppf(0.8, 1))
            * float(np.std(diffs[:2], ddof=1))
            / math.sqrt(2)
        )
        - 1
        < 0.25
        and shortcut > 0
    )


def test_seeds_needed_is_the_first_n_with_80_percent_power():
    # the audit's case: the +-0.02 margin at a spread of sd 0.056-0.085 needs ~67-155 seeds
    for sd in (0.056, 0.085):
        n = seeds_needed(0.02, sd)
        assert power(0.02, sd, n) >= 0.8 > power(0.02, sd, n - 1)
    assert 60 < seeds_needed(0.02, 0.056) < 75 and 140 < seeds_needed(0.02, 0.085) < 160
    assert seeds_needed(0.0, 0.05) is None and seeds_needed(1e-6, 1.0, most=1000) is None


def test_holm_adjusts_in_the_input_order_and_stays_monotone():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02,
    # 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == []


def test_the_two_sided_p_is_scipys_paired_t_test():
    a, b = _arms([0.02, -0.01, 0.03, 0.0, 0.01])
    seeds = sorted(a)
    want = st.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue
    assert paired(a, b, margin=0.02).p_diff == pytest.approx(want, rel=1e-9)


def test_one_seed_and_no_common_seed():
    one = paired({0: 3.1}, {0: 3.0}, margin=0.02)
    assert (
        one.n == 1
        and one.ci is None
        and one.verdict == "inconclusive"
        and "n = 1 seed" in one.describe()
    )
    none = paired({0: 3.1}, {1: 3.0}, margin=0.02)
    assert none.n == 0 and none.describe() == "no seed where both runs trained"


def test_mean_ci():
    m, ci = mean_ci([1.0, 2.0, 3.0])
    half = st.t.ppf(0.975, 2) / math.sqrt(3)  # sd = 1
    assert m == 2.0 and ci == pytest.approx((2 - half, 2 + half))
    assert mean_ci([1.0]) == (1.0, None) and mean_ci([]) == (None, None)
