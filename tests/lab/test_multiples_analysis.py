"""lab/multiples.py against independent references (statsmodels' paired TOST and Holm, scipy's
paired t test, Wilcoxon and F distribution) on runs made by hand."""

import math
import random

import numpy as np
import pytest
from scipy import stats as st
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

from lab import multiples
from lab.read import Run, judge
from lab.studyfile import Multiples, Pair, Rule

RULE = Rule(speed_free=True)
FACTORS = (1.0, 10.0)
SPEC = Multiples(
    FACTORS,
    (({}, 0.01),),
    "by hand",
    (
        Pair("rms - ln", (("model.norm", "rms"),), (("model.norm", "ln"),), "test", "same - same"),
        Pair("same - same", (("model.norm", "same1"),), (("model.norm", "same2"),), "yardstick"),
    ),
)


def run(norm: str, factor: float, seed: int, final: float, status: str = "ok") -> Run:
    """A finished 300-step run: a falling curve to `final` (a non-finite one for diverged)."""
    evals = [(s, final + 0.5 * (1 - s / 300) ** 2) for s in range(25, 301, 25)]
    records = [{"step": 0, "val/loss": 7.0}] + [{"step": s, "val/loss": v} for s, v in evals]
    if status == "diverged":
        records = records[:3]
        final = math.nan
    config = {"model.norm": norm, "optim.lr": 0.01 * factor, "train.seed": seed, "train.steps": 300}
    summary = {
        "status": status,
        "final_val_loss": final,
        "best_val_loss": final,
        "unigram_entropy": 6.0,
    }
    return Run(f"{norm}-{factor}-{seed}", None, config, summary, records)


def make(noise: float, yard: float, shift: float, seed: int = 0, unstable: tuple = ()) -> list:
    rng = random.Random(seed)
    runs = []
    for s in range(24):
        for f in FACTORS:
            base = 4.0 + 0.1 * f + rng.gauss(0, 0.05)
            status = "diverged" if (f, s) in unstable else "ok"
            runs.append(run("rms", f, s, base + shift + rng.gauss(0, noise), status))
            runs.append(run("ln", f, s, base + rng.gauss(0, noise)))
            runs.append(run("same1", f, s, base + rng.gauss(0, yard)))
            runs.append(run("same2", f, s, base + rng.gauss(0, yard)))
    return judge(runs, RULE)


def losses(runs, norm, f):
    """{seed: final loss (inf: diverged)} of one arm at factor f."""
    return {
        r.seed: math.inf if r.final is None else r.final
        for r in runs
        if r.config["model.norm"] == norm and r.lr == 0.01 * f
    }


def test_each_factor_is_paired_by_seed_as_scipy_and_statsmodels_compute_it():
    runs = make(noise=0.01, yard=0.01, shift=0.003)
    rows = multiples.compare(runs, SPEC, 0.02)
    tests = [r for r in rows if r["role"] == "test"]
    assert [r["factor"] for r in tests] == list(FACTORS)
    family = []
    for row in tests:
        a, b = losses(runs, "rms", row["factor"]), losses(runs, "ln", row["factor"])
        seeds = sorted(a)
        d = [a[s] - b[s] for s in seeds]
        t = st.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
        p_tost = ttost_paired(
            np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds]), -0.02, 0.02
        )[0]
        assert row["n"] == 24 and row["mean"] == pytest.approx(sum(d) / 24, abs=1e-12)
        assert row["p_t"] == pytest.approx(t.pvalue, rel=1e-9)
        assert row["p_tost"] == pytest.approx(p_tost, rel=1e-6)
        # the spread: an F ratio of the two pairs' variances
        y = [
            losses(runs, "same1", row["factor"])[s] - losses(runs, "same2", row["factor"])[s]
            for s in seeds
        ]
        ratio = math.sqrt(st.tvar(d) / st.tvar(y))
        assert row["spread"]["ratio"] == pytest.approx(ratio, rel=1e-9)
        lo = ratio / math.sqrt(st.f.ppf(0.975, 23, 23))
        assert row["spread"]["ci"][0] == pytest.approx(lo, rel=1e-9)
        family += [row["p_mean"], row["spread"]["p"]]
    holm = multipletests(family, method="holm")[1]
    got = [p for row in tests for p in (row["holm_mean"], row["holm_spread"])]
    assert got == pytest.approx(list(holm), rel=1e-9)
    # noise 0.01, margin 0.02, 24 seeds: equivalent; the same spread as the yardstick's
    assert all(r["verdict"] == "equivalent within +-0.02" for r in tests)


def test_a_real_difference_and_a_wider_spread_are_seen():
    runs = make(noise=0.05, yard=0.005, shift=0.08, seed=1)
    tests = [r for r in multiples.compare(runs, SPEC, 0.02) if r["role"] == "test"]
    assert all(r["verdict"] == "different" for r in tests)
    assert all(r["spread"]["verdict"] == "more than identical" for r in tests)
    assert all(r["spread"]["ci"][0] > 1 for r in tests)


def test_an_unstable_run_stays_in_its_pair_as_the_worst_outcome():
    """Diverged RMSNorm runs at x10 on 10 seeds: no mean is computed there; the Wilcoxon test with
    them as the worst outcome (scipy's on the same differences) says the arms differ."""
    runs = make(noise=0.01, yard=0.01, shift=0.0, unstable={(10.0, s) for s in range(10)})
    row = next(r for r in multiples.compare(runs, SPEC, 0.02) if r["factor"] == 10.0)
    assert row["role"] == "test" and row["unstable"] == [10, 0] and row["n"] == 24
    assert "mean" not in row and row["decides"] == "wilcoxon"
    a, b = losses(runs, "rms", 10.0), losses(runs, "ln", 10.0)
    worst = max(v for v in [*a.values(), *b.values()] if math.isfinite(v)) + 1
    d = [(worst if not math.isfinite(a[s]) else a[s]) - b[s] for s in sorted(a)]
    assert row["p_wilcoxon"] == pytest.approx(st.wilcoxon(d).pvalue, rel=1e-9)
    assert row["verdict"] == "different"
    out = multiples.outcomes(runs, SPEC, ["model.norm"])
    cell = next(o for o in out if o["arm"] == {"model.norm": "rms"} and o["factor"] == 10.0)
    assert cell["unstable"] == 10 and cell["kinds"]["non-finite"] == 10


def test_a_run_still_falling_at_its_end_is_slow_never_unstable():
    """Above the unigram entropy and still falling: slow under the speed-free rule (its amendment,
    above_unigram, called it failed)."""
    r = run("rms", 10.0, 0, 6.1)  # ends above the unigram entropy (6.0), falling
    judge([r], RULE)
    assert r.why is None and multiples.kind_of(r) == "slow"
    amended = run("rms", 10.0, 0, 6.1)
    judge([amended], Rule(speed_free=True, above_unigram=True))
    assert amended.why is not None
