"""Failure kinds from constructed eval curves, instability alone, and claims on separated arms
decided on the brackets (docs/METHODS.md): constructed runs, no training."""

import pytest

from lab.arms import Arm
from lab.claims import Context, check_claims
from lab.read import Run, failure_kind, judge
from lab.studyfile import Rule

UNIGRAM, L0, STEPS = 5.8, 6.9, 300


def run(curve, lr=0.01, seed=0, norm="rmsnorm", status="ok"):
    """A finished run of STEPS steps whose evals at 50, 100, ... are `curve`."""
    records = [{"step": 0, "val/loss": L0}] + [
        {"step": 50 * (i + 1), "val/loss": v} for i, v in enumerate(curve)
    ]
    summary = {
        "status": status,
        "final_val_loss": curve[-1] if curve else None,
        "unigram_entropy": UNIGRAM,
        "best_val_loss": min(curve) if curve else None,
    }
    config = {"optim.lr": lr, "train.seed": seed, "train.steps": STEPS, "model.norm": norm}
    return Run(f"{norm}-{lr}-{seed}", None, config, summary, records)


@pytest.mark.parametrize(
    "curve,status,kind",
    [
        # Post-LN at the unigram level from step 100
        ([5.98, 5.92, 5.88, 5.89, 5.89, 5.89], "ok", "collapsed"),
        # falling back to the unigram level from above
        ([6.5, 6.2, 6.0, 5.96, 5.92, 5.88], "ok", "collapsed"),
        # Pre-LN still learning past unigram at step 300
        ([5.88, 5.86, 5.76, 5.73, 5.65, 5.59], "ok", "slow"),
        ([5.0, 4.6, 5.3, 5.2, 5.1, 5.0], "ok", "blew up"),  # 0.7 above its best so far
        ([5.0, 7.1, 6.0, 5.9, 5.9, 5.9], "ok", "blew up"),  # above L0
        ([5.0, 4.0], "diverged", "non-finite"),
    ],
)
def test_a_failed_runs_kind_is_read_from_its_curve(curve, status, kind):
    r = run(curve, status=status)
    if status == "diverged":
        r.summary["final_val_loss"] = float("nan")
    judge([r], Rule())
    assert r.failed and r.kind == kind, (r.why, r.kind)


def test_a_flat_run_below_unigram_failed_by_its_arms_gap_is_stalled_and_a_trained_run_no_kind():
    good, behind = run([4.0, 3.5, 3.2, 3.1, 3.0, 3.0]), run([4.8, 4.6, 4.5, 4.5, 4.5, 4.5], seed=1)
    judge(
        [good, behind],
        Rule(name="gap", learn_margin=None, blowup_margin=None, above_l0=False, arm_gap=1.0),
    )
    assert good.kind is None and behind.failed and failure_kind(behind, Rule()) == "stalled"


def _arm(label, edges, seeds=5):
    """An arm over lrs 1e-3..1: seeds fail at every LR from edges[seed] up (separated when all edges
    agree)."""
    lrs = [1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1, 3.16e-1, 1.0]
    runs = []
    for s in range(seeds):
        for lr in lrs:
            curve = [5.9] * 6 if lr >= edges[s] else [5.0, 4.5, 4.2, 4.0, 3.9, 3.9]
            runs.append(run(curve, lr, s, label))
    judge(runs, Rule())
    return Arm(label, runs)


def _decide(a, b, expect):
    claim = {
        "paper": "P",
        "says": "S",
        "metric": "lr50",
        "expect": expect,
        "a": {"model.norm": a.label},
        "b": {"model.norm": b.label},
    }
    ctx = Context(["model.norm"], [], [0, 1, 2, 3, 4], [], (), 0.02, 0.1, 2.0, {})
    (c,) = check_claims([claim], {a.label: a, b.label: b}, ctx)
    return c


@pytest.mark.slow
def test_two_identical_separated_arms_are_cannot_tell_not_the_same():
    """0/5 then 5/5 at the same LRs in both arms: Firth's joint fit puts the ratio at 1 with a CI
    inside x2, but the data only say it lies in 0.316..3.16; the `same` claim is decided on the
    brackets: cannot tell."""
    a, b = _arm("rmsnorm", [0.1] * 5), _arm("layernorm", [0.1] * 5)
    assert not a.failure().identified and a.failure().bounds == (3.16e-2, 0.1)
    c = _decide(a, b, "same")
    assert c.ratio.ratio == pytest.approx(1.0, rel=1e-3) and c.estimate is None
    assert c.ratio.bounds == (pytest.approx(0.316, rel=1e-3), pytest.approx(3.16, rel=2e-3))
    assert c.agreement == "cannot tell" and "decided on the brackets" in c.note


@pytest.mark.slow
def test_separated_arms_a_decade_apart_differ_on_their_brackets_and_mixed_arms_are_numbers():
    a, b = _arm("rmsnorm", [1.0] * 8, seeds=8), _arm("layernorm", [1e-2] * 8, seeds=8)
    c = _decide(a, b, "same")
    assert c.direction == "different" and c.p == pytest.approx(2 * 2.0**-8)  # two ends, 8 runs each
    assert c.agreement == "disagrees"
    # seeds cross the edge at different LRs
    mixed = _arm("rmsnorm", [0.1, 0.1, 3.16e-2, 0.316, 0.1])
    assert mixed.failure().identified


def test_instability_alone_censors_slow_runs():
    """Slow runs are left out of the instability fit; collapsed ones fail it."""
    runs = [run([5.9] * 6, 1.0, s) for s in range(3)]  # collapsed
    runs += [run([5.88, 5.86, 5.76, 5.73, 5.65, 5.59], 0.1, s) for s in range(3)]  # slow
    runs += [run([5.0, 4.5, 4.2, 4.0, 3.9, 3.9], 0.01, s) for s in range(3)]  # trained
    judge(runs, Rule())
    arm = Arm("rmsnorm", runs)
    main, unstable = arm.failure(lambda r: r.failed), arm.instability()
    assert main.n == 9 and main.failed == 6 and unstable.n == 6 and unstable.failed == 3
    assert arm.kinds()[0.1] == {
        "runs": 3,
        "trained": 0,
        "collapsed": 0,
        "blew up": 0,
        "non-finite": 0,
        "slow": 3,
        "stalled": 0,
        "no curve": 0,
    }


def test_the_speed_free_rule_fails_persisting_collapse_and_blow_ups_but_not_slow_runs():
    """Issue 60's primary rule: a run still falling at its end is slow (trained, its instability
    not seen), a collapse that persists to the end and a blow-up fail, as under the main rule."""
    rule = Rule(speed_free=True)
    collapsed = run([5.98, 5.92, 5.88, 5.89, 5.89, 5.89])
    slow = run([5.95, 5.94, 5.93, 5.90, 5.80, 5.70], seed=1)  # at the plateau, escaping late
    blew = run([5.0, 4.6, 5.3, 5.2, 5.1, 5.0], seed=2)
    trained = run([5.0, 4.5, 4.2, 4.0, 3.9, 3.9], seed=3)
    judge([collapsed, slow, blew, trained], rule)
    assert collapsed.failed and collapsed.why.startswith("collapsed: final 5.89")
    assert not slow.failed and not trained.failed and blew.failed
    judge([slow], Rule())  # the main rule: never 0.25 below unigram within the budget
    assert slow.failed and slow.kind == "slow"
    assert "a collapse that persists" in rule.describe()


def test_above_unigram_fails_a_run_falling_back_to_the_unigram_level_but_not_a_slow_one():
    """The speed-free rule's amendment (issue 60): a final eval above the unigram entropy fails
    whatever its slope; a run still falling below it stays slow (trained)."""
    amended = Rule(speed_free=True, above_unigram=True)
    relearning = run([6.3, 6.1, 6.05, 6.0, 5.95, 5.9])  # above 5.8, falling 0.03 per 10%
    slow = run([5.95, 5.94, 5.93, 5.90, 5.80, 5.70], seed=1)
    judge([relearning, slow], Rule(speed_free=True))
    assert not relearning.failed and not slow.failed  # the rule before its amendment
    judge([relearning, slow], amended)
    assert relearning.failed and relearning.why == "collapsed: final 5.90 > unigram 5.80, falling"
    assert relearning.kind == "collapsed" and not slow.failed
    assert "above the unigram entropy, whatever its slope" in amended.describe()


def test_above_unigram_needs_the_speed_free_rule():
    from lab.studyfile import parse_rule
    from training.config import ConfigError

    assert parse_rule({"speed_free": True, "above_unigram": True}, "f", "main").above_unigram
    with pytest.raises(ConfigError, match="f: above_unigram amends speed_free: true"):
        parse_rule({"above_unigram": True}, "f", "main")


def test_a_bisected_arms_failures_are_summed_per_half_decade_band():
    from lab.report import MAX_LR_ROWS, lr_bands

    def row(runs, collapsed):
        return {"runs": runs, "trained": runs - collapsed, "collapsed": collapsed, "blowup": 0}

    few = {0.01: row(2, 1), 0.0316: row(3, 3)}
    assert lr_bands(few) == [("0.01", few[0.01]), ("0.0316", few[0.0316])]
    # 0.0316 x / 1.78 .. x 1.78 is one band (0.0178-0.0562), 0.1's the next, 0.3 the one above
    lrs = [0.02, 0.025, 0.0316, 0.04, 0.05, 0.06, 0.09, 0.12, 0.3]
    many = {lr: row(2, 1 + (i % 2)) for i, lr in enumerate(lrs)}
    assert len(many) > MAX_LR_ROWS
    got = lr_bands(many)
    assert [cell for cell, _ in got] == ["0.02-0.05 (5 LRs)", "0.06-0.12 (3 LRs)", "0.3"]
    assert got[0][1] == {"runs": 10, "trained": 3, "collapsed": 7, "blowup": 0}
    assert got[1][1] == {"runs": 6, "trained": 1, "collapsed": 5, "blowup": 0}
    for k in ("runs", "trained", "collapsed"):  # nothing lost or counted twice
        assert sum(r[k] for _, r in got) == sum(r[k] for r in many.values())


def test_a_bisected_pairs_per_lr_rows_keep_only_the_lrs_with_a_paired_test():
    from types import SimpleNamespace as NS

    from lab.report import MAX_LR_ROWS, per_lr

    def paired(n):
        return NS(
            n=n,
            mean=0.01 if n else None,
            ci=(0.0, 0.02) if n > 1 else None,
            verdict="inconclusive",
            p_diff=0.5 if n > 1 else None,
        )

    grid_a, grid_b, bis_a, bis_b = (NS(label=x) for x in ("g/a", "g/b", "b/a", "b/b"))
    grid = [(grid_a, grid_b, "model.norm", lr, paired(n)) for lr, n in [(0.01, 8), (0.1, 0)]]
    lrs = [0.01 * 1.1**i for i in range(MAX_LR_ROWS + 3)]
    bis = [
        (bis_a, bis_b, "model.norm", lr, paired(24 if i == 0 else i % 2))
        for i, lr in enumerate(lrs)
    ]
    text = "\n".join(per_lr(NS(per_lr=grid + bis)))
    rows = [
        line for line in text.splitlines() if line.startswith("| g/") or line.startswith("| b/")
    ]
    # a grid pair keeps every LR (n 0: both failed there); a bisected pair only n >= 2
    assert [r.split(" | ")[3:5] for r in rows] == [["0.01", "8"], ["0.1", "0"], ["0.01", "24"]]
    assert f"the {len(lrs) - 1} LRs with fewer than 2 seeds" in text
    assert "left out" not in "\n".join(per_lr(NS(per_lr=grid)))
