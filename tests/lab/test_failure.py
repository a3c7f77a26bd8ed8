"""lab/lr50.py: the failure curve P(fail | lr) and LR50 with its 95% CI, on simulated studies with
a known edge (coverage), on separated grids and on the cases without an edge."""

import math

import numpy as np
import pytest

from lab.lr50 import (
    _design,
    _fit,
    _loglik,
    _penalized,
    _profile,
    fit_failure_curve,
    lr50_ratio,
    p_fail_upper,
)

OFFSETS = np.array([-0.6, -0.3, 0.0, 0.3, 0.6])  # the grid around the edge, in decades (x 2 steps)


def _simulate(rng, lr50: float, slope: float, seeds: int = 5, centre: float | None = None):
    lrs = np.repeat((centre or lr50) * 10**OFFSETS, seeds)
    p = 1 / (1 + np.exp(-slope * (np.log10(lrs) - math.log10(lr50))))
    return lrs, rng.random(len(lrs)) < p


def _beyond_the_top(rng, slope: float, seeds: int = 5):
    """The edge 0.9 decades above the grid's centre, past its top (0.6): few or no failures
    (Pre-LN's case)."""
    return _simulate(rng, 0.01 * 10**0.9, slope, seeds, centre=0.01)


def _per_seed_thresholds(rng, slope: float, seeds: int = 5):
    """Each seed has its own threshold LR (log-normal around 0.01, the spread of a logistic of this
    slope) and fails at every LR above it: a seed that fails at one LR fails above it (not
    independent draws)."""
    t = 0.01 * 10 ** rng.normal(0, 1.8 / slope, seeds)
    lrs = np.tile(0.01 * 10**OFFSETS, seeds)
    return lrs, lrs > np.repeat(t, len(OFFSETS))


def _covers(fit, truth: float) -> bool:
    """Whether what the report states contains the truth: the CI where LR50 is identified, else the
    bound."""
    lo, hi = fit.ci if fit.identified else fit.bounds
    if fit.failed == 0:
        lo, hi = fit.top, None
    return (lo is None or lo <= truth) and (hi is None or hi >= truth)


DESIGNS = {
    "centred": (_simulate, 0.01),
    "beyond the top": (_beyond_the_top, 0.01 * 10**0.9),
    "per-seed thresholds": (_per_seed_thresholds, 0.01),
}


@pytest.mark.slow
@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("slope", [2.0, 4.0, 8.0])
def test_what_a_report_states_covers_a_known_lr50_in_90_percent_of_simulated_studies_or_more(
    design, slope
):
    """80 simulated arms per design and slope (5 LRs x 2 around 0.01, 5 seeds): the CI where the
    arm's LR50 is identified, the bound the data give where it is not, contains the true LR50 in >=
    90% of them. Measured on these 80: centred 0.99 / 0.975 / 0.925, edge beyond the grid's top 0.99
    / 1.0 / 1.0, per-seed thresholds 1.0 / 0.925 / 0.96 at slopes 2 / 4 / 8 (on 200 arms: 0.99 /
    0.98 / 0.93, 0.99 / 1.0 / 1.0, 0.98 / 0.93 / 0.925)."""
    simulate, truth = DESIGNS[design]
    rng = np.random.default_rng(int(slope) + len(design))
    covered = [
        _covers(
            fit_failure_curve(
                *simulate(rng, 0.01, slope) if design == "centred" else simulate(rng, slope)
            ),
            truth,
        )
        for _ in range(80)
    ]
    assert np.mean(covered) >= 0.90, np.mean(covered)


# the default study's rmsnorm/pre arm as its report judged it (22 runs, one failure, at the top LR)
RMS_PRE = (
    [0.001] * 2
    + [0.00173] * 2
    + [0.003] * 6
    + [0.00548] * 2
    + [0.01] * 2
    + [0.03] * 2
    + [0.1] * 2
    + [0.316] * 2
    + [1.0] * 2,
    [False] * 20 + [True, False],
)


def test_one_failure_at_the_top_leaves_the_upper_end_open_and_is_a_bound():
    """The report printed rmsnorm/pre's LR50 as 2.59 (0.249..8.19): a bounded minimizer returned the
    profile far below its maximum (-166 where a grid gives ~ -2.4), which closed the interval at
    8.19. The profile taken on a grid and refined leaves it open, and with one failure the report
    states a bound, not a number."""
    fit = fit_failure_curve(*RMS_PRE)
    assert fit.ci[1] is None
    assert not fit.identified and fit.bounds == (0.316, None)
    assert (
        fit.describe()
        == "LR50 > 0.316: 0/2 failed there (fewer than 2 failures: a bracket, not an estimate)"
    )


@pytest.mark.slow
def test_the_profile_is_the_maximum_a_brute_force_scan_finds():
    lrs, failed = RMS_PRE
    x = np.log10(lrs) - np.log10(lrs).mean()
    y = np.asarray(failed, float)
    slopes = np.geomspace(1e-5, 200, 200_001)  # the profile's domain: slopes 1e-5..MAX_SLOPE
    for x50 in (-1.0, 0.0, 0.8, 1.5, 2.5, 3.5):
        brute = float(np.max(_penalized(np.stack([-slopes * x50, slopes], 1), _design(x), y)))
        assert _profile(x50, x, y) == pytest.approx(brute, abs=1e-6)


def test_complete_separation_is_a_bracket_whatever_the_penalised_fit_returns():
    """0/5 then 5/5: Firth's fit is finite (the bracket's geometric midpoint, its CI set by the
    penalty), but the data say only that LR50 lies in the bracket: not identified, described as the
    bracket with its counts."""
    lrs = [1e-3] * 5 + [3e-3] * 5 + [1e-2] * 5 + [3e-2] * 5
    fit = fit_failure_curve(lrs, [False] * 10 + [True] * 10)
    assert fit.lr50 == pytest.approx(math.sqrt(3e-3 * 1e-2), rel=1e-3)  # the penalty's midpoint
    assert not fit.identified and fit.bounds == (3e-3, 1e-2) and fit.ends == ((0, 5), (5, 5))
    assert fit.describe().startswith(
        "0.003 < LR50 < 0.01: 0/5 then 5/5 failed (no LR with both outcomes"
    )
    # one seed of the five fails one LR early: mixed outcomes at 3e-3 identify it
    mixed = fit_failure_curve(lrs, [False] * 5 + [True] + [False] * 4 + [True] * 10)
    assert mixed.identified and mixed.lr50 < 1e-2 and "11 of 20 runs failed" in mixed.describe()


def test_no_edge_no_lr50():
    lrs = [1e-3, 1e-2, 1e-1] * 3
    assert fit_failure_curve(lrs, [False] * 9).lr50 is None
    assert fit_failure_curve(lrs, [True] * 9).lr50 is None
    assert fit_failure_curve(lrs, [True, False, False] * 3).lr50 is None  # fails at the low LR only
    assert (
        fit_failure_curve(lrs, [False] * 9)
        .describe()
        .startswith("LR50 > 0.1: 0/9 failed (no run failed")
    )
    assert (
        fit_failure_curve(lrs, [True] * 9).describe().startswith("LR50 < 0.001: 3/3 failed there")
    )


def test_the_fit_is_the_maximum_of_the_penalized_likelihood():
    """Newton on Firth's modified score converges where the penalized log-likelihood's gradient (by
    central differences, computed from the objective alone) vanishes."""
    rng = np.random.default_rng(0)
    lrs, failed = _simulate(rng, 0.01, 4.0)
    x, y = np.log10(lrs) - np.log10(lrs).mean(), failed.astype(float)
    b0, b1 = _fit(x, y)
    eps = 1e-5
    grad = [
        (_loglik(b0 + eps, b1, x, y) - _loglik(b0 - eps, b1, x, y)) / (2 * eps),
        (_loglik(b0, b1 + eps, x, y) - _loglik(b0, b1 - eps, x, y)) / (2 * eps),
    ]
    assert max(abs(g) for g in grad) < 1e-4
    assert _loglik(b0, b1, x, y) > max(
        _loglik(b0 + d0, b1 + d1, x, y) for d0, d1 in ((0.05, 0), (0, 0.05), (-0.05, 0), (0, -0.05))
    )


@pytest.mark.slow
def test_the_lr50_ratio_ci_covers_a_known_ratio_in_90_to_99_percent_of_simulated_pairs():
    """40 simulated pairs of arms (LR50 0.02 and 0.01, slope 4, the grid above, 5 seeds each): the
    joint profile CI of LR50_A / LR50_B contains 2 in 90-99% of them (measured: 38 of these 40; 94
    of 100 pairs)."""
    rng = np.random.default_rng(1)
    covered = fitted = 0
    for _ in range(40):
        fit = lr50_ratio(*_simulate(rng, 0.02, 4.0), *_simulate(rng, 0.01, 4.0))
        if fit.ratio is None:
            continue
        fitted += 1
        lo, hi = fit.ci
        covered += (lo is None or lo <= 2) and (hi is None or hi >= 2)
    assert fitted >= 38 and 0.90 <= covered / fitted <= 0.99, (covered, fitted)


@pytest.mark.slow
def test_the_lr50_ratio_on_separated_arms_and_on_arms_with_one_outcome():
    lrs = [1e-3] * 5 + [3e-3] * 5 + [1e-2] * 5 + [3e-2] * 5
    # A's edge between 3e-3 and 1e-2, B's between 1e-2 and 3e-2, both separated: the brackets allow
    # ratios 0.1..1 (3e-3 / 3e-2 .. 1e-2 / 1e-2) and say so; the likelihood-ratio test still orders
    # the arms
    fit = lr50_ratio(lrs, [False] * 10 + [True] * 10, lrs, [False] * 15 + [True] * 5)
    assert (
        not fit.identified
        and fit.bounds == (pytest.approx(0.1), pytest.approx(1.0))
        and fit.p < 0.01
    )
    assert fit.describe().startswith(
        "LR50 ratio between 0.1 and 1 (an arm's LR50 is only bracketed"
    )
    # A's upper end, B's lower end: 5 runs each
    assert fit.bracket_p(at_most=1.0) == pytest.approx(2 * 2**-5)
    assert fit.bracket_p(at_most=0.5) is None and fit.bracket_p(0.5, 2.0) is None
    # with mixed outcomes on both sides (one seed each fails early) the ratio is a number with a CI
    fit = lr50_ratio(
        lrs,
        [False] * 5 + [True] + [False] * 4 + [True] * 10,
        lrs,
        [False] * 10 + [True] + [False] * 4 + [True] * 5,
    )
    assert fit.identified and 0.1 < fit.ratio < 1 and fit.ci[0] < fit.ratio < fit.ci[1]
    # A never fails: its LR50 lies above its largest LR (0.03) and B's below 0.03: the ratio is a
    # bound, > 1
    fit = lr50_ratio(lrs, [False] * 20, lrs, [False] * 15 + [True] * 5)
    # A: > 0.03, B: < 0.03
    assert not fit.identified and fit.describe().startswith("LR50 ratio > 1")
    # each arm one outcome: a bound only, the lowest LR of A over the highest of B
    fit = lr50_ratio([3e-3, 1e-2, 3e-2] * 3, [True] * 9, [3e-3, 1e-2, 3e-2] * 3, [False] * 9)
    assert not fit.identified and fit.bounds == (None, pytest.approx(0.1)) and fit.p < 1e-3
    assert fit.describe().startswith("LR50 ratio < 0.1 (an arm's LR50 is only bracketed")
    # nothing failed, or one LR only: nothing to fit
    assert lr50_ratio(lrs, [False] * 20, lrs, [False] * 20).ratio is None
    assert not lr50_ratio([1e-2] * 4, [True, False] * 2, [1e-2] * 4, [False] * 4).identified


@pytest.mark.slow
def test_a_reports_table_prints_a_ratio_only_where_both_lr50s_are_identified():
    """The exploratory "Arms compared" table once printed Firth's ratio and CI for arms that are
    only bracketed (pystdlib's pre-norm pair at 300 steps: "0.969 (0.812..1.16)")."""
    from lab.report import ratio_cells

    lrs = [1e-3] * 5 + [3e-3] * 5 + [1e-2] * 5 + [3e-2] * 5
    separated = lr50_ratio(lrs, [False] * 10 + [True] * 10, lrs, [False] * 15 + [True] * 5)
    assert separated.ratio is not None  # the penalised point exists, and is not printed
    assert ratio_cells(separated) == ("between 0.1 and 1 (brackets)", "-")
    mixed = lr50_ratio(
        lrs,
        [False] * 5 + [True] + [False] * 4 + [True] * 10,
        lrs,
        [False] * 10 + [True] + [False] * 4 + [True] * 5,
    )
    ratio, ci = ratio_cells(mixed)
    assert float(ratio) == pytest.approx(mixed.ratio, rel=2e-3) and ".." in ci


@pytest.mark.slow
def test_the_equivalence_of_two_lr50s_within_a_factor():
    """TOST on the log ratio by the profile's signed root: two arms with the same mixed edge
    (per-seed thresholds between grid LRs) are within x4 of each other (p < 0.05) and not outside
    it; an edge a decade apart is outside x2. Separated arms are not identified: TOST is not run on
    them (p 1)."""
    lrs = np.array([1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1] * 8)
    # seed s fails above its own threshold
    thresholds = np.repeat(10 ** np.linspace(-2.6, -1.9, 8), 7)
    same = list(lrs > thresholds)
    fit = lr50_ratio(lrs, same, lrs, same)
    p_in, p_out = fit.within(4.0)
    assert fit.identified and p_in < 0.05 and p_out > 0.5
    far = lr50_ratio(lrs, list(lrs > thresholds / 10), lrs, list(lrs > thresholds))
    p_in, p_out = far.within(2.0)
    assert far.identified and p_in > 0.5 and p_out < 0.05
    separated = [lr > 5e-3 for lr in lrs]
    assert lr50_ratio(lrs, separated, lrs, separated).within(4.0) == (1.0, 1.0)


def test_the_upper_bound_of_p_fail_falls_below_the_edge():
    lrs = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1] * 6
    failed = [lr > 2e-2 for lr in lrs]
    assert (
        p_fail_upper(lrs, failed, 1e-3)
        < 0.05
        < p_fail_upper(lrs, failed, 1e-2)
        < p_fail_upper(lrs, failed, 3e-2)
    )


@pytest.mark.slow
def test_brackets_that_meet_at_one_lr_with_opposite_outcomes_order_the_arms():
    """At lr 0.1 every run of A trained and every run of B failed: LR50_A > 0.1 > LR50_B (each end
    a strict binomial statement), so the ratio's lower bound of exactly 1 orders the arms; brackets
    that overlap do not."""
    from lab.lr50 import lr50_ratio, lr50_test

    def runs(outcomes):
        lrs = [lr for lr, fails in outcomes for _ in fails]
        return lrs, [f for _, fails in outcomes for f in fails]

    a = runs([(0.01, [0] * 5), (0.1, [0] * 5), (0.316, [1] * 5)])
    b = runs([(0.01, [0] * 5), (0.1, [1] * 5), (0.316, [1] * 5)])
    fit = lr50_ratio(*a, *b)
    assert not fit.identified and fit.bounds[0] == 1.0
    assert lr50_test(fit, "higher", 2.0)[1:] == ("higher", None)
    c = runs([(0.01, [0] * 5), (0.0316, [1] * 5), (0.316, [1] * 5)])  # B's bracket below 0.0316
    overlap = lr50_ratio(*runs([(0.01, [0] * 5), (0.1, [1] * 5)]), *c)  # A's below 0.1: overlap
    p, direction, note = lr50_test(overlap, "higher", 2.0)
    assert direction is None and "do not order" in note


def test_an_interval_widened_to_its_looks_contains_the_95_one_and_says_its_level():
    """After adaptive stopping a claim's p is x looks (Bonferroni), so its interval is the
    1 - 0.05 / looks profile-likelihood interval: wider, same point, its level recorded."""
    from lab.lr50 import lr50_ratio, widen

    lrs = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1] * 4
    fail_a = [lr >= 3e-2 if i % 4 else lr >= 1e-2 for i, lr in enumerate(lrs)]
    fail_b = [lr >= 1e-2 if i % 3 else lr >= 3e-2 for i, lr in enumerate(lrs)]
    fit = lr50_ratio(lrs, fail_a, lrs, fail_b)
    assert fit.ci[0] is not None and fit.level == 0.95
    same = widen(fit, 0.95)
    assert same.ci == pytest.approx(fit.ci, rel=1e-3)
    wide = widen(fit, 1 - 0.05 / 6)
    assert wide.level == pytest.approx(1 - 0.05 / 6) and wide.ratio == fit.ratio
    assert wide.ci[0] < fit.ci[0] < fit.ratio < fit.ci[1] < wide.ci[1]
    assert "99.2 CI" not in wide.describe() and "0.992 CI" in wide.describe()
