"""LR choices that cannot decide a verdict (issue 76): the fitted common-LR rule and a failed run
kept in its pair as the worst outcome, on runs made by hand."""

import math
import random

import pytest
from scipy import stats as st

from lab.arms import Arm
from lab.claims import ranked
from lab.lr50 import p_fail_at
from lab.protocol import SAFE, common_lr
from lab.read import Run, judge
from lab.studyfile import Rule

GRID = (0.001, 0.00316, 0.01, 0.0316, 0.1)


def run(arm: str, lr: float, seed: int, final: float, failed: bool = False) -> Run:
    """A finished 100-step run: a smooth descent to `final`, or a blow-up from 4.0."""
    steps = range(10, 101, 10)
    curve = [(s, 4.0 + 3.0 * s / 100) for s in steps] if failed else [
        (s, final + 1.5 * (1 - s / 100) ** 2) for s in steps
    ]  # fmt: skip
    records = [{"step": 0, "val/loss": 6.5}] + [{"step": s, "val/loss": v} for s, v in curve]
    summary = {
        "status": "ok",
        "final_val_loss": curve[-1][1],
        "best_val_loss": min(v for _, v in curve),
        "unigram_entropy": 6.0,
    }
    config = {"arm": arm, "optim.lr": lr, "train.seed": seed, "train.steps": 100}
    return Run(f"{arm}-{lr}-{seed}", None, config, summary, records)


def arm(name: str, best: float, edge: float, seeds=range(5), rng=None) -> list[Run]:
    """An arm whose loss is lowest at `best` (quadratic in log LR) and whose runs fail above
    `edge`."""
    rng = rng or random.Random(0)
    out = []
    for lr in GRID:
        for s in seeds:
            loss = 3.0 + 0.3 * (math.log10(lr / best)) ** 2 + rng.gauss(0, 0.01)
            out.append(run(name, lr, s, loss, failed=lr > edge))
    return judge(out, Rule())


def test_the_fitted_common_lr_is_safe_and_near_both_bests():
    """Both arms' fitted P(fail) < 5% and each mean loss within 0.1 nats of its own best at the
    chosen LR; the next grid LR up fails one of the two."""
    a, b = arm("a", 0.0316, 0.05), arm("b", 0.01, 0.05)
    lr, how = common_lr(a, b, GRID, list(range(5)), rule="fitted", within=0.1)
    # at 0.0316 both trained on every seed, but the fit next to a sharp edge on 5 seeds puts
    # P(fail) at ~0.09: not safe by its point estimate
    assert lr == 0.01 and "within 0.1 nats" in how
    for runs in (a, b):
        up = [r for r in runs if r.lr >= 0.001]
        assert p_fail_at([r.lr for r in up], [r.failed for r in up], lr) < SAFE
    # A's loss at 0.01 is 0.3 x 0.5^2 = 0.075 above its best: inside 0.1; at 0.05 it would not be
    lr, how = common_lr(a, b, GRID, list(range(5)), rule="fitted", within=0.05)
    assert lr is None and "not decided at a common LR" in how


def test_the_bound_rule_is_unchanged_by_default():
    a, b = arm("a", 0.0316, 0.05), arm("b", 0.01, 0.02)
    assert common_lr(a, b, GRID, list(range(5))) == common_lr(
        a, b, GRID, list(range(5)), rule="bound"
    )


def test_a_failed_run_stays_in_its_pair_as_the_worst_outcome():
    """ranked(): each failed run above every finite loss, two failed runs tie; scipy's Wilcoxon on
    those differences."""
    rng = random.Random(1)
    a = {s: 3.0 + rng.gauss(0, 0.02) for s in range(16)}
    b = {s: 3.05 + rng.gauss(0, 0.02) for s in range(16)}
    a[3] = math.inf  # A failed on seed 3: its worst outcome, not a dropped seed
    a[5] = b[5] = math.inf  # both failed on seed 5: a tie
    got = ranked(a, b)
    top = max(v for v in [*a.values(), *b.values()] if math.isfinite(v)) + 1
    d = [(top if a[s] == math.inf else a[s]) - (top if b[s] == math.inf else b[s]) for s in a]
    assert got["n"] == 16 and got["failed"] == [2, 1]
    assert got["p"] == pytest.approx(st.wilcoxon([x for x in d if x != 0]).pvalue, rel=1e-12)
    assert got["median"] == pytest.approx(sorted(d)[7] / 2 + sorted(d)[8] / 2)


def test_the_rank_tests_shift_and_interval_are_the_tables():
    """Without failed runs: the Hodges-Lehmann shift is the median of the 136 Walsh averages of 16
    differences, and the 95% CI runs from the 30th to the 107th of them (the signed-rank table's
    two-sided 0.05 critical value for n = 16 is 29; Hollander & Wolfe, Table A.4)."""
    rng = random.Random(5)
    a = {s: 3.0 + rng.gauss(0, 0.03) for s in range(16)}
    b = {s: 3.02 + rng.gauss(0, 0.03) for s in range(16)}
    d = [a[s] - b[s] for s in range(16)]
    walsh = sorted((x + y) / 2 for i, x in enumerate(d) for y in d[i:])
    got = ranked(a, b)
    assert len(walsh) == 136 and got["shift"] == pytest.approx((walsh[67] + walsh[68]) / 2)
    assert got["ci"] == [walsh[29], walsh[106]]


def test_a_rank_bound_the_failed_runs_decide_is_not_printed():
    """A failed run's stand-in is an order, not a loss: one failed run leaves the shift and the CI
    where the 15 trained pairs put them; with 8 of 16 failed the upper bound and the shift move
    with the stand-in and are None."""
    rng = random.Random(6)
    a = {s: 3.0 + rng.gauss(0, 0.03) for s in range(16)}
    b = {s: 3.02 + rng.gauss(0, 0.03) for s in range(16)}
    one = ranked({**a, 3: math.inf}, b)
    assert one["shift"] is not None and None not in one["ci"]
    assert one["ci"][0] < one["shift"] < one["ci"][1]
    many = ranked({**a, **{s: math.inf for s in range(8)}}, b)
    assert many["shift"] is None and many["ci"][1] is None and many["ci"][0] is not None


def test_a_claims_failed_run_decides_with_the_rank_test():
    """protocol.failed_runs: worst: a best_loss claim whose arm failed on a test seed is decided
    by the rank test over every seed, not by the t test on the seeds where both trained."""
    from lab.claims import Context, check_claims

    class P:
        common_rule, common_within, failed_runs = "bound", 0.1, "worst"

    rng = random.Random(2)
    runs_a = [run("a", 0.01, s, 3.0 + rng.gauss(0, 0.02), failed=s == 7) for s in range(16)]
    runs_b = [run("b", 0.01, s, 3.1 + rng.gauss(0, 0.02)) for s in range(16)]
    judge(runs_a + runs_b, Rule())
    A, B = Arm("arm=a", runs_a), Arm("arm=b", runs_b)
    A.best_lr = B.best_lr = 0.01
    claim = {"paper": "p", "says": "A lower", "a": {"arm": "a"}, "b": {"arm": "b"},
             "metric": "best_loss", "expect": "lower"}  # fmt: skip
    ctx = Context(["arm"], list(range(16)), [], [], GRID, 0.02, 0.1, 2.0, {}, protocol=P())
    (c,) = check_claims([claim], {"arm=a": A, "arm=b": B}, ctx)
    assert c.nested.rank is not None and c.nested.rank["failed"] == [1, 0]
    assert c.p == c.nested.rank["p"] and c.direction == "lower" and c.agreement == "agrees"
