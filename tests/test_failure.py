"""study/failure.py: the failure curve P(fail | lr) and LR50 with its 95% CI, on simulated studies with a known
edge (coverage), on separated grids and on the cases without an edge."""

import math

import numpy as np
import pytest

from study.failure import _fit, _loglik, fit_failure_curve, lr50_ratio

OFFSETS = np.array([-0.6, -0.3, 0.0, 0.3, 0.6])  # the grid around the edge, in decades (x 2 steps)


def _simulate(rng, lr50: float, slope: float, seeds: int = 5):
    lrs = np.repeat(lr50 * 10 ** OFFSETS, seeds)
    p = 1 / (1 + np.exp(-slope * (np.log10(lrs) - math.log10(lr50))))
    return lrs, rng.random(len(lrs)) < p


@pytest.mark.slow
@pytest.mark.parametrize("slope", [2.0, 4.0, 8.0])
def test_the_95_percent_ci_covers_a_known_lr50_in_90_to_99_percent_of_simulated_studies(slope):
    """200 simulated arms (5 LRs x 2 around the edge, 5 seeds each, failures drawn from a logistic curve with
    LR50 = 0.01): the profile-likelihood CI contains 0.01 in 90-99% of them (measured 0.945-0.96 for these
    slopes; steep curves separate completely in some repetitions, Firth's penalty keeps those finite)."""
    rng = np.random.default_rng(int(slope))
    covered, fitted = 0, 0
    for _ in range(200):
        fit = fit_failure_curve(*_simulate(rng, 0.01, slope))
        if fit.lr50 is None:
            continue
        fitted += 1
        lo, hi = fit.ci
        covered += (lo is None or lo <= 0.01) and (hi is None or hi >= 0.01)
    assert fitted >= 190 and 0.90 <= covered / fitted <= 0.99, (covered, fitted)


def test_complete_separation_is_finite_inside_its_bracket_and_says_so():
    lrs = [1e-3] * 5 + [3e-3] * 5 + [1e-2] * 5 + [3e-2] * 5
    fit = fit_failure_curve(lrs, [False] * 10 + [True] * 10)
    assert fit.separated and fit.bracket == (3e-3, 1e-2)
    assert 3e-3 < fit.lr50 < 1e-2 and fit.lr50 == pytest.approx(math.sqrt(3e-3 * 1e-2), rel=1e-3)  # symmetric data
    lo, hi = fit.ci
    assert lo is not None and hi is not None and lo < fit.lr50 < hi
    assert "complete separation between lr 0.003 and 0.01" in fit.describe() and "10 of 20 runs" in fit.describe()


def test_no_edge_no_lr50():
    lrs = [1e-3, 1e-2, 1e-1] * 3
    assert fit_failure_curve(lrs, [False] * 9).lr50 is None
    assert fit_failure_curve(lrs, [True] * 9).lr50 is None
    assert fit_failure_curve(lrs, [True, False, False] * 3).lr50 is None  # fails at the low LR only
    assert fit_failure_curve(lrs, [False] * 9).describe() == "no run failed up to lr 0.1 (9 runs): LR50 above it"
    assert fit_failure_curve(lrs, [True] * 9).describe() == "no LR50 (9 of 9 runs failed)"


def test_the_fit_is_the_maximum_of_the_penalized_likelihood():
    """Newton on Firth's modified score converges where the penalized log-likelihood's gradient (by central
    differences, computed from the objective alone) vanishes."""
    rng = np.random.default_rng(0)
    lrs, failed = _simulate(rng, 0.01, 4.0)
    x, y = np.log10(lrs) - np.log10(lrs).mean(), failed.astype(float)
    b0, b1 = _fit(x, y)
    eps = 1e-5
    grad = [(_loglik(b0 + eps, b1, x, y) - _loglik(b0 - eps, b1, x, y)) / (2 * eps),
            (_loglik(b0, b1 + eps, x, y) - _loglik(b0, b1 - eps, x, y)) / (2 * eps)]
    assert max(abs(g) for g in grad) < 1e-4
    assert _loglik(b0, b1, x, y) > max(_loglik(b0 + d0, b1 + d1, x, y) for d0, d1 in ((0.05, 0), (0, 0.05),
                                                                                       (-0.05, 0), (0, -0.05)))


@pytest.mark.slow
def test_the_lr50_ratio_ci_covers_a_known_ratio_in_90_to_99_percent_of_simulated_pairs():
    """100 simulated pairs of arms (LR50 0.02 and 0.01, slope 4, the grid above, 5 seeds each): the joint
    profile CI of LR50_A / LR50_B contains 2 in 90-99% of them (measured 94)."""
    rng = np.random.default_rng(1)
    covered = fitted = 0
    for _ in range(100):
        fit = lr50_ratio(*_simulate(rng, 0.02, 4.0), *_simulate(rng, 0.01, 4.0))
        if fit.ratio is None:
            continue
        fitted += 1
        lo, hi = fit.ci
        covered += (lo is None or lo <= 2) and (hi is None or hi >= 2)
    assert fitted >= 95 and 0.90 <= covered / fitted <= 0.99, (covered, fitted)


def test_the_lr50_ratio_on_separated_arms_and_on_arms_with_one_outcome():
    lrs = [1e-3] * 5 + [3e-3] * 5 + [1e-2] * 5 + [3e-2] * 5
    # A's edge between 3e-3 and 1e-2, B's between 1e-2 and 3e-2: a ratio near 1/sqrt(10), both ends bounded
    fit = lr50_ratio(lrs, [False] * 10 + [True] * 10, lrs, [False] * 15 + [True] * 5)
    assert 0.15 < fit.ratio < 0.7 and fit.ci[0] is not None and fit.ci[1] is not None and fit.p < 0.01
    assert fit.ci[0] < fit.ratio < fit.ci[1]
    # A never fails: its LR50 lies above its largest LR, so the ratio's upper end is open
    fit = lr50_ratio(lrs, [False] * 20, lrs, [False] * 15 + [True] * 5)
    assert fit.ratio > 1 and fit.ci[1] is None and fit.ci[0] is not None
    # each arm one outcome: a bound only, min LR of A over max LR of B
    fit = lr50_ratio([3e-3, 1e-2, 3e-2] * 3, [True] * 9, [3e-3, 1e-2, 3e-2] * 3, [False] * 9)
    assert fit.ratio is None and fit.ci == (None, pytest.approx(0.1)) and fit.p < 1e-3
    assert fit.describe().startswith("LR50 ratio below 0.1 (A failed at every LR, B at none)")
    # nothing failed, or one LR only: nothing to fit
    assert lr50_ratio(lrs, [False] * 20, lrs, [False] * 20).ratio is None
    assert lr50_ratio([1e-2] * 4, [True, False] * 2, [1e-2] * 4, [False] * 4).describe().startswith("no LR50 ratio")
