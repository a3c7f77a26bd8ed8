"""Paired critical LRs (lab/critical.py) on constructed data: brackets, bisection, the paired
comparison against scipy's t tests, and the design simulation's bisection."""

import dataclasses
import math
from pathlib import Path

import pytest
from scipy import stats

from lab.analyses.simulate_critical import measure
from lab.critical import Bracket, bracket, compare, grid_offset, next_lr


def test_a_bracket_is_the_largest_stable_and_smallest_unstable_lr():
    assert bracket({0.01: False, 0.03: False, 0.1: True, 0.3: True}) == Bracket(0.03, 0.1)
    assert bracket({0.01: False}).estimate() is None
    with pytest.raises(ValueError, match="not monotone"):
        bracket({0.01: True, 0.03: False})


def test_bisection_halves_the_log_bracket_until_the_resolution():
    lo, hi, steps = 0.01, 0.01 * 10**0.5, 0
    while (lr := next_lr(Bracket(lo, hi), 1.19, 1.0, 1e-4)) is not None:
        assert lr == pytest.approx(math.sqrt(lo * hi))
        lo, hi = (lr, hi) if steps % 2 else (lo, lr)
        steps += 1
    assert steps == 3 and hi / lo <= 1.19  # x3.16 -> 1.78 -> 1.33 -> 1.15
    assert next_lr(Bracket(1.0, None), 1.19, 1.0, 1e-4) is None  # stable at the cap: censored
    assert next_lr(Bracket(0.1, None), 1.19, 1.0, 1e-4) == pytest.approx(0.4)


def test_the_simulated_bisection_finds_the_critical_lr_within_its_resolution():
    for seed, c in enumerate([0.0013, 0.02, 0.0571, 0.3]):
        est, runs = measure(c, seed, 1.19)
        assert abs(math.log(est / c)) <= math.log(1.19) / 2 + 1e-12 and runs == 5
    assert 1 <= grid_offset(7, 1.19) < 1.19


def test_under_a_band_the_simulated_bisection_scatters_without_seeing_it():
    """Per-run noise in the failure LR (simulate_critical's band): estimates scatter around c by
    about the band, while bisection, sampling inside its bracket, almost never contradicts itself
    (critical-lr-control: 0 of 12 seeds flagged, 10 of 12 not monotone when pooled)."""
    import numpy as np

    rng = np.random.default_rng(0)
    got = [measure(0.02, seed, 1.19, 0.25, rng)[0] for seed in range(200)]
    logs = [math.log(e / 0.02) for e in got if e is not None]
    assert got.count(None) < 10 and 0.1 < float(np.std(logs)) < 0.4


def test_the_paired_comparison_matches_scipys_t_tests():
    a = {s: 0.01 * math.exp(0.1 * s) * (1.05 + 0.01 * (s % 3)) for s in range(8)}
    b = {s: 0.01 * math.exp(0.1 * s) for s in range(8)}
    p = compare(a, b, margin=1.1)
    d = [math.log(a[s] / b[s]) for s in range(8)]
    m = math.log(1.1)
    tost = max(
        stats.ttest_1samp(d, -m, alternative="greater").pvalue,
        stats.ttest_1samp(d, m, alternative="less").pvalue,
    )
    assert p.p_equivalence == pytest.approx(tost) and p.verdict == "agrees"
    assert p.p_difference == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.95)
    assert p.ci == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert p.n == 8 and p.censored == 0


def test_a_known_1_5x_difference_differs_and_censored_seeds_are_counted():
    a = {s: 0.015 * (1 + 0.02 * (-1) ** s) for s in range(6)}
    b = {s: 0.01 for s in range(6)} | {6: None}
    p = compare(a, b)
    assert p.verdict == "differs" and p.ci[0] < 1.5 < p.ci[1] and p.censored == 1
    with pytest.raises(ValueError, match="at least 2"):
        compare({0: 0.1}, {0: 0.1})


def _critical_study(tmp_path):
    from lab.studyfile import load_study

    path = tmp_path / "c.yaml"
    tiny = Path(__file__).resolve().parents[2] / "configs" / "train" / "tiny.yaml"
    path.write_text(
        f"config: {tiny}\n"
        "grid: {norm: [rmsnorm, layernorm], lr: [1.0e-3, 3.16e-3, 1.0e-2, 3.16e-2, 1.0e-1]}\n"
        "failure: {speed_free: true}\n"
        "protocol: {selection_seeds: [0, 1], test_seeds: [2], refine: 0, bracket: {steps: 0}, "
        "critical: {seeds: [10, 11, 12, 13, 14, 15], resolution: 1.19, margin: 1.1}}\n"
    )
    return load_study(path)


@pytest.mark.parametrize("ratio, verdict", [(1.0, "agrees"), (1.5, "differs")])
def test_the_critical_stage_bisects_each_seed_and_the_pair_is_decided(tmp_path, ratio, verdict):
    """Each seed fails from its own critical LR (shared by the norms, times `ratio` for RMSNorm):
    the stage starts at the arm's edge on the seed's offset grid and bisects until hi / lo <=
    1.19; the paired comparison of the estimates says `agrees` at 1 and `differs` at 1.5."""
    from test_adaptive import drive

    from lab.critical import arm_estimates

    crit = {s: 0.02 * math.exp(0.4 * math.sin(3.0 * s)) for s in range(20)}
    study = _critical_study(tmp_path)
    runs, log = drive(
        study,
        lambda norm, lr, seed: lr >= crit[seed] * (ratio if norm == "rmsnorm" else 1.0),
        upto="critical",
    )
    assert [stage for stage, _ in log].count("critical") >= 3  # the edge, then bisection rounds
    est = {}
    for norm in ("rmsnorm", "layernorm"):
        mine = [r for r in runs if r.config["model.norm"] == norm]
        est[norm] = arm_estimates(mine, range(10, 16))
        for seed, e in est[norm].items():
            truth = crit[seed] * (ratio if norm == "rmsnorm" else 1.0)
            assert abs(math.log(e / truth)) <= math.log(1.19) / 2 + 0.01, (norm, seed)
    q = compare(est["rmsnorm"], est["layernorm"], 1.1)
    assert q.verdict == verdict and q.n == 6


def _arm(crit: dict, config: dict, factor: float = 1.0):
    """An arm whose seed s fails at every filed LR >= crit[s] / factor, on an x1.1 grid."""
    from types import SimpleNamespace

    lrs = [0.01 * 1.1**k for k in range(40)]
    runs = [
        SimpleNamespace(
            seed=s, lr=lr, failed=lr * factor >= c, finished=True, config=config | {KEY: factor}
        )
        for s, c in crit.items()
        for lr in lrs
        if abs(math.log(lr * factor / c)) < 0.2  # the bisection's last bracket, about
    ]
    return SimpleNamespace(runs=runs)


KEY = "optim.lr_factor"


def test_pairs_that_differ_in_one_key_are_compared_and_the_lr_factor_control_is_known():
    """Arms differing in the norm come first; a x1.3 LR factor shows as 1 / 1.3 with the known
    ratio inside its interval; a pair differing in two keys is not compared."""
    from types import SimpleNamespace

    from lab.critical import findings
    from lab.studyfile import Critical

    crit = {s: 0.05 * math.exp(0.3 * math.sin(2.0 * s)) for s in range(10, 22)}
    noisy = {s: c * (1.02 if s % 2 else 0.98) for s, c in crit.items()}
    arms = {
        "ln": _arm(crit, {"model.norm": "layernorm"}),
        "rms": _arm(noisy, {"model.norm": "rmsnorm"}),
        "ln x1.3": _arm(crit, {"model.norm": "layernorm"}, 1.3),
    }
    crit_cfg = Critical(seeds=tuple(crit), resolution=1.19, margin=1.1)
    res = SimpleNamespace(
        file=SimpleNamespace(
            protocol=SimpleNamespace(critical=crit_cfg),
            rule=SimpleNamespace(describe=lambda: "a rule"),
        ),
        arms=arms,
        keys=["model.norm", KEY],
    )
    lines = findings(res)
    assert len(lines) == 3  # the header, ln / rms, ln / ln x1.3 (rms / ln x1.3 differ in both)
    assert lines[1].startswith("- **ln** / **rms** (differ in model.norm)")
    assert "**agrees**" in lines[1]
    assert "(differ in optim.lr_factor)" in lines[2] and "**differs**" in lines[2]
    assert "the known ratio 1.300 is inside the CI" in lines[2]
    assert "rules out" in lines[1] and "rules out" not in lines[2]  # no bound beside `differs`
    assert "0 of 12 seeds are not monotone in it" in lines[2]
    from lab.critical import comparisons

    rows = comparisons(res)  # report.json's `critical`: the numbers the lines print
    assert [(r["a"], r["b"], r["key"]) for r in rows] == [
        ("ln", "rms", "model.norm"),
        ("ln", "ln x1.3", KEY),
    ]
    assert rows[1]["known"] == pytest.approx(1.3) and rows[1]["bands"] == [1.0] * 12
    assert f"{rows[0]['ratio']:.3f}" in lines[1] and f"x{rows[0]['bound']:.2f}" in lines[1]
    # one seed trains at x1.5 above its critical LR in the x1.3 arm: the pooled runs say so
    extra = SimpleNamespace(**vars(arms["ln x1.3"].runs[0]))
    extra.lr, extra.failed = crit[extra.seed] * 1.5 / 1.3, False
    arms["ln x1.3"].runs.append(extra)
    line = findings(res)[2]
    assert "1 of 12 seeds are not monotone in it" in line
    assert "trained up to x1.4" in line  # x1.5 over the critical LR, the grid's first failure


def test_the_bound_is_the_narrowest_margin_tost_accepts():
    a = {s: 0.01 * math.exp(0.1 * s) * (1.05 + 0.02 * (s % 3)) for s in range(10)}
    b = {s: 0.01 * math.exp(0.1 * s) for s in range(10)}
    m = compare(a, b).bound()
    assert compare(a, b, margin=m).p_equivalence == pytest.approx(0.05)
    assert compare(a, b, margin=m * 1.01).verdict == "agrees"
    assert compare(a, b, margin=m / 1.01).verdict != "agrees"


@pytest.mark.parametrize("n, sd", [(12, 0.3), (60, 0.22), (8, 0.05)])
def test_the_detectable_ratio_has_the_stated_power(n, sd):
    """At the detectable ratio the two-sided t test's power (scipy's noncentral t) is ~0.8."""
    from lab.critical import Paired

    q = Paired(n, 0, 1.0, (1.0, 1.0), 1.0, 1.0, "inconclusive", sd)
    delta = math.log(q.detectable())
    t = stats.t(n - 1)
    crit = t.ppf(0.975)
    nc = delta / (sd / math.sqrt(n))
    power = stats.nct(n - 1, nc).sf(crit) + stats.nct(n - 1, nc).cdf(-crit)
    assert power == pytest.approx(0.8, abs=0.02)


def test_a_seeds_first_critical_lrs_stay_within_the_studys_lr_range(tmp_path):
    """A wide edge (x100 here) moved by the seed's offset would start a bisection far above
    bracket.max_lr (critical-lr's 60-seed form asked for 953 under a cap of 10): the starts are
    kept within min_lr..max_lr, and the offset still moves them seed by seed."""
    from test_adaptive import FakeRun

    from lab.protocol import critical_lrs

    study = _critical_study(tmp_path)
    p = dataclasses.replace(study.protocol, max_lr=0.05)
    runs = [
        FakeRun(f"s{s}-{lr}", lr, s, lr >= (0.1 if s else 0.00316))
        for s in (0, 1)
        for lr in (1.0e-3, 3.16e-3, 1.0e-2, 3.16e-2, 1.0e-1)
    ]
    starts = {seed: critical_lrs(runs, seed, p) for seed in range(10, 16)}
    assert all(0.001 <= lr <= 0.05 for lrs in starts.values() for lr in lrs)
    assert len({tuple(lrs) for lrs in starts.values()}) > 1
    unclamped = {seed: critical_lrs(runs, seed, study.protocol) for seed in range(10, 16)}
    assert max(lr for lrs in unclamped.values() for lr in lrs) > 0.05  # the case is real
