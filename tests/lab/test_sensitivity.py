"""lab/sensitivity.py: the per-arm interval of a mean over few seeds covers what it claims to."""

import math

import numpy as np
import pytest

from lab.sensitivity import BOOTSTRAP_FROM, bootstrap_ci, mean_interval


def _coverage(interval, n: int, draw, truth: float, trials: int = 2000) -> float:
    rng = np.random.default_rng(n)
    hits = 0
    for _ in range(trials):
        lo, hi = interval(list(draw(rng, n)))
        hits += lo <= truth <= hi
    return hits / trials


DRAWS = {
    "normal": (lambda rng, n: rng.normal(1.0, 0.2, n), 1.0),
    "log-normal": (lambda rng, n: np.exp(rng.normal(0.0, 0.3, n)), math.exp(0.045)),
}


@pytest.mark.parametrize("n", [3, 5, 8])
@pytest.mark.parametrize("dist", DRAWS)
def test_the_per_arm_interval_covers_the_mean_at_few_seeds(n, dist):
    """2000 simulated arms of n seeds (per-seed sensitivities normal, or log-normal: skewed as
    losses are): the interval the report prints covers the true mean in >= 93% (measured 0.93-0.96);
    the percentile bootstrap it replaced covers 0.75 / 0.79-0.81 / 0.88 at n = 3 / 5 / 8, which this
    test would catch."""
    draw, truth = DRAWS[dist]
    assert n < BOOTSTRAP_FROM
    assert _coverage(mean_interval, n, draw, truth) >= 0.93
    # the old interval: the test can fail
    assert _coverage(bootstrap_ci, n, draw, truth, 400) < 0.91
