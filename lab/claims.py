"""The comparisons every report uses, and a study file's claims of the literature decided by them:
one primary test per claim and arm pair, Holm-adjusted over the study's whole family (every claim of
the study file is in it, whatever its data; a claim its runs cannot test enters with p = 1).

- best_loss: each arm at its own best LR, chosen on the selection seeds, compared on the test seeds
  where both runs trained (nested: the seeds that chose an LR never test it): the paired t test
  (expect higher / lower) or TOST at the study's margin (expect same).
- common_loss: both arms at their common safe LR (lab/protocol.py common_lr), on the common seeds:
  as above.
- lr50: the two arms' failure curves fitted together (lab/lr50.py lr50_ratio): the
  likelihood-ratio test of ratio = 1 (higher / lower), or TOST of the ratio within [1/m, m], m the
  study's ratio_margin (same).
- lr_sensitivity: per-seed LR sensitivity (lab/sensitivity.py), paired by seed: as best_loss, at
  the study's sensitivity_margin.

A `same` claim's test is two-sided: TOST for `agrees`, its mirror (the difference lies beyond the
margin) for `disagrees`; it enters Holm with the smaller p (only one of the two can be small). A
`same` claim on losses whose seeds are fewer than TOST needs at the observed spread for 80% power
stays in the family and says `cannot tell`. Agreement: `agrees` / `disagrees` when the Holm-adjusted
p < 0.05; anything else `cannot tell`."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

from scipy import stats as st

from lab.arms import Arm
from lab.lr50 import RatioFit, lr50_ratio, lr50_test, widen
from lab.paired import ALPHA, Paired, holm, paired, tost_seeds_needed
from lab.protocol import common_lr
from lab.read import same
from lab.sensitivity import Sensitivity
from lab.text import BUDGET, g, rank_shift


@dataclass
class Nested:
    """Two arms' losses, each at its own LR (its best, or their common safe LR), paired over the
    seeds."""

    lrs: tuple[float, float] | None
    paired: Paired
    dropped: list[
        str
    ]  # seeds left out because a run failed: "seed 3: A failed (did not learn ...)"
    needed: int | None = (
        None  # seeds TOST needs at this spread for 80% power (None: more than 100,000 or no spread)
    )
    how: str = ""  # how the LR was chosen (common_loss)
    # common_loss: [(arm, its best LR, common / best, nats worse)]
    gaps: list = field(default_factory=list)
    # protocol.failed_runs "worst" and a failed run in the pairs: {n, failed: [a, b], median, p}
    # (a Wilcoxon signed-rank test, each failed run the worst outcome); it decides the claim
    rank: dict | None = None


def losses_at(
    a: Arm,
    b: Arm,
    lra: float | None,
    lrb: float | None,
    seeds,
    margin: float,
    how: str = "",
    worst: bool = False,
) -> Nested:
    """A at lra - B at lrb over these seeds, where both runs trained; the others listed as
    dropped, or with `worst` kept in their pairs as the worst outcome (ranked())."""
    if lra is None or lrb is None:
        return Nested(None, paired({}, {}, margin), [], None, how)
    la, lb = a.losses(lra, seeds), b.losses(lrb, seeds)
    dropped = []
    for arm, lr in ((a, lra), (b, lrb)):
        dropped += [
            f"seed {r.seed}: {arm.label} failed ({r.why})"
            for r in sorted(arm.at(lr), key=lambda r: str(r.seed))
            if r.seed in seeds and r.finished and r.loss is None
        ]
    p = paired(la, lb, margin)
    sd = None if p.ci is None or p.mde is None else _sd(la, lb)
    out = Nested((lra, lrb), p, dropped, tost_seeds_needed(margin, sd) if sd else None, how)
    if worst and dropped:
        out.rank = ranked(_outcomes(a, lra, seeds), _outcomes(b, lrb, seeds))
    return out


def _outcomes(arm: Arm, lr: float, seeds) -> dict:
    """{seed: final loss, inf for a failed run} of an arm's finished runs at lr."""
    return {
        r.seed: math.inf if r.failed else r.final
        for r in arm.at(lr)
        if r.seed in seeds and r.finished
    }


def ranked(a: dict, b: dict) -> dict:
    """A - B over the seeds both finished, a failed run the worst outcome (above every finite loss
    of the two; two failed runs tie): n, the failed runs per arm, the median difference, the
    two-sided Wilcoxon signed-rank p, and the shift's Hodges-Lehmann estimate with its 95% CI (the
    test inverted; a number that moves with the failed runs' stand-in value is None)."""
    seeds = sorted(set(a) & set(b))
    finite = [v for s in seeds for v in (a[s], b[s]) if math.isfinite(v)]

    def diffs(top: float) -> list[float]:
        return [
            (top if a[s] == math.inf else a[s]) - (top if b[s] == math.inf else b[s]) for s in seeds
        ]

    top = (max(finite) if finite else 0.0) + 1.0
    d = diffs(top)
    nonzero = [x for x in d if x != 0]
    p = float(st.wilcoxon(nonzero).pvalue) if len(nonzero) >= 2 else 1.0
    shift, ci = _shift(d)
    shift_far, ci_far = _shift(diffs(top + 1000.0))  # the stand-in far away: what it decides moves
    if ci:
        ci = [x if ci_far and x == y else None for x, y in zip(ci, ci_far or ci, strict=True)]
    return {
        "n": len(seeds),
        "failed": [sum(a[s] == math.inf for s in seeds), sum(b[s] == math.inf for s in seeds)],
        "median": statistics.median(d) if d else None,
        "p": p,
        "shift": shift if shift == shift_far else None,
        "ci": ci,
    }


def _shift(d: list[float]) -> tuple[float | None, list | None]:
    """The Hodges-Lehmann shift (the median of the Walsh averages (d_i + d_j) / 2, i <= j) and the
    95% CI of the shifts delta the signed-rank test of d - delta does not reject; its bounds are
    Walsh averages, between which the test's p is constant."""
    walsh = sorted({(x + y) / 2 for i, x in enumerate(d) for y in d[i:]})
    if len(d) < 2 or len(walsh) < 2:
        return None, None
    mids = [(x + y) / 2 for x, y in itertools.pairwise(walsh)]
    kept = [i for i, m in enumerate(mids) if st.wilcoxon([x - m for x in d]).pvalue >= ALPHA]
    shift = statistics.median((x + y) / 2 for i, x in enumerate(d) for y in d[i:])
    if not kept:
        return shift, None
    return shift, [walsh[kept[0]], walsh[kept[-1] + 1]]


def nested(a: Arm, b: Arm, test_seeds, margin: float, worst: bool = False) -> Nested:
    """A - B on the test seeds, each arm at its best_lr (chosen on other seeds)."""
    how = "each arm's best LR on the selection seeds"
    return losses_at(a, b, a.best_lr, b.best_lr, test_seeds, margin, how, worst)


def common(
    a: Arm, b: Arm, grid, selection_seeds, common_seeds, margin: float, protocol=None
) -> Nested:
    """A - B at their common safe LR (the protocol's rule), on the common seeds."""
    rule = {} if protocol is None else {"rule": protocol.common_rule}
    if protocol is not None:
        rule["within"] = protocol.common_within
    lr, how = common_lr(a.runs, b.runs, grid, selection_seeds, common_seeds, **rule)
    worst = protocol is not None and protocol.failed_runs == "worst"
    out = losses_at(a, b, lr, lr, common_seeds, margin, how, worst)
    if lr is not None:
        out.gaps = [gap(arm, lr, selection_seeds) for arm in (a, b)]
    return out


def gap(arm: Arm, lr: float, seeds) -> tuple:
    """(label, the arm's own best LR, lr / best, mean loss at lr - at best over the seeds that ran
    both): how far a common LR sits from the arm's best."""
    best = arm.best_lr
    if best is None:
        return arm.label, None, None, None
    at, there = arm.losses(lr, seeds), arm.losses(best, seeds)
    both = sorted(set(at) & set(there), key=str)
    nats = statistics.fmean(at[s] - there[s] for s in both) if both else None
    return arm.label, best, lr / best, nats


def gap_text(gaps: list) -> str:
    """'each arm's distance from its own best LR: A 0.00316 (x0.316, +0.551 nats), ...'."""
    parts = [
        f"{label} {g(best)} (x{g(x)}" + (f", {nats:+.3f} nats" if nats is not None else "") + ")"
        for label, best, x, nats in gaps
        if best is not None
    ]
    return "the common LR against each arm's own best LR: " + ", ".join(parts) if parts else ""


def _sd(a: dict, b: dict) -> float:
    return statistics.stdev([a[s] - b[s] for s in sorted(set(a) & set(b), key=str)])


def ratio(a: Arm, b: Arm) -> RatioFit:
    """LR50_A / LR50_B over both arms' runs from their floors up."""
    ra, rb = a.upper(), b.upper()
    return lr50_ratio(
        [r.lr for r in ra], [r.failed for r in ra], [r.lr for r in rb], [r.failed for r in rb]
    )


def claim_pairs(claim: dict, arms: dict[str, Arm], keys: list[str]) -> list[tuple[Arm, Arm]]:
    """The arm pairs (A, B) a claim compares: A has claim.a's values, B claim.b's; a field named on
    one side only takes the same value on the other; fields named on neither side must agree (one
    pair per combination)."""
    sides = {"a": {**claim["b"], **claim["a"]}, "b": {**claim["a"], **claim["b"]}}

    def fits(arm: Arm, side: str) -> bool:
        return all(same(arm.runs[0].config.get(k), v) for k, v in sides[side].items())

    free = [k for k in keys if k not in sides["a"]]
    return [
        (A, B)
        for A in arms.values()
        if fits(A, "a")
        for B in arms.values()
        if B is not A
        and fits(B, "b")
        and all(same(A.runs[0].config.get(k), B.runs[0].config.get(k)) for k in free)
    ]


@dataclass
class Checked:
    claim: dict
    a: str | None
    b: str | None
    nested: Nested | None = (
        None  # best_loss, common_loss, lr_sensitivity (the per-seed S as "losses")
    )
    ratio: RatioFit | None = None  # lr50
    p: float | None = (
        None  # the primary test's raw p (None: the runs cannot test it; p = 1 in the family)
    )
    p_holm: float | None = None
    agreement: str = "not run"
    direction: str | None = (
        None  # what the primary test points to: higher | lower | same | different
    )
    note: str = ""  # why a test gave no verdict
    size: Checked | None = (
        None  # lr_sensitivity: the claim decided again with L* the best of the model size
    )
    # lr50: {rule name: RatioFit} under the other pre-registered rules
    rules: dict = field(default_factory=dict)
    looks: int = 1  # lr50 under the adaptive edge stage: its p is the raw p x looks

    @property
    def estimate(self) -> float | None:
        """A - B (nats), or LR50_A / LR50_B where both are identified."""
        if self.ratio is not None:
            return self.ratio.ratio if self.ratio.identified else None
        return self.nested.paired.mean if self.nested else None


def _same_test(p: Paired) -> tuple[float | None, str | None]:
    """(the smaller of TOST's p and its mirror's, which one) for a paired difference at its
    margin."""
    if p.ci is None:
        return None, None
    se = (p.ci[1] - p.ci[0]) / (2 * st.t.ppf(1 - ALPHA / 2, p.n - 1))
    if se == 0:
        p_out = 0.0 if abs(p.mean) > p.margin else 1.0
    else:
        p_out = float(st.t.sf((abs(p.mean) - p.margin) / se, p.n - 1))  # H0: |d| <= margin
    return (p.p_tost, "same") if p.p_tost <= p_out else (p_out, "different")


def _decide(c: Checked, ratio_margin: float, looks: int = 1) -> None:
    """The primary test's raw p and the direction it points to; an LR50 claim the adaptive edge
    stage served has its p times the stage's looks (Bonferroni over the looks it could stop at)."""
    expect = c.claim["expect"]
    if c.ratio is not None:
        c.p, c.direction, note = lr50_test(c.ratio, expect, ratio_margin)
        c.note = note or ""
        if c.p is not None and looks > 1:
            c.p = min(1.0, looks * c.p)
            c.looks = looks
            if c.ratio.identified:  # the interval that matches the p: 1 - alpha / looks
                c.ratio = widen(c.ratio, 1 - ALPHA / looks)
        return
    if c.nested.rank is not None:  # a failed run kept in its pair: the rank test decides
        rank = c.nested.rank
        c.p = rank["p"]
        median = rank["median"] or 0.0
        if expect == "same":
            c.direction = "different"
        elif median:
            c.direction = "higher" if median > 0 else "lower"
        return
    p = c.nested.paired
    if expect == "same":
        c.p, c.direction = _same_test(p)
        if c.direction == "same" and (c.nested.needed is None or p.n < c.nested.needed):
            c.note = (
                f"TOST at +-{p.margin:g} needs {c.nested.needed or '> 100,000'} seeds at this "
                "spread for 80% "
                f"power, the study has {p.n}: an estimate, not an equivalence"
            )
        return
    c.p = p.p_diff
    if p.mean is not None and p.ci is not None:
        c.direction = "higher" if p.mean > 0 else "lower"


def _agreement(c: Checked) -> str:
    if c.p is None or c.p_holm is None or c.p_holm >= ALPHA or c.direction is None or c.note:
        return "cannot tell"
    expect = c.claim["expect"]
    if expect == "same":
        return "agrees" if c.direction == "same" else "disagrees"
    return "agrees" if c.direction == expect else "disagrees"


@dataclass
class Context:
    """What the claims need of the study beyond its arms."""

    keys: list[str]
    test_seeds: list
    selection_seeds: list
    common_seeds: list
    grid: tuple
    margin: float
    sensitivity_margin: float
    ratio_margin: float
    sensitivity: dict  # {arm label: Sensitivity}, L* the arm's own best (Wortsman et al.)
    # the same with L* the best of the model size
    sensitivity_size: dict = field(default_factory=dict)
    looks: int = 1  # the adaptive edge stage's looks (lab/adaptive.py); 1: no such stage
    # {budget: stage}: budgets whose stages have not all run (their claims wait)
    running: dict = field(default_factory=dict)
    protocol: object = None  # the study file's Protocol (its LR and failed-run rules), if any


def _running(arm: Arm, running: dict) -> str | None:
    """The stage an arm's budget waits on, if its stages have not all run."""
    if not running:
        return None
    if None in running:
        return running[None]
    steps = arm.runs[0].config.get(BUDGET)
    return next((s for b, s in running.items() if steps is not None and float(steps) == b), None)


def check_claims(claims: list[dict], arms: dict[str, Arm], ctx: Context) -> list[Checked]:
    """Each claim against these runs (one result per arm pair it names), Holm-adjusted over all of
    them."""
    out = []
    for claim in claims:
        pairs = claim_pairs(claim, arms, ctx.keys)
        if not pairs:
            out.append(Checked(claim, None, None))
        for A, B in pairs:
            c = Checked(claim, A.label, B.label)
            wait = _running(A, ctx.running)
            if wait:  # interim: in the family with p = 1 (conservative for the others)
                c.note = f"its budget's {wait} stage has not run"
                out.append(c)
                continue
            metric = claim["metric"]
            if metric == "lr50":
                c.ratio = ratio(A, B)
            elif metric == "common_loss":
                c.nested = common(
                    A, B, ctx.grid, ctx.selection_seeds, ctx.common_seeds, ctx.margin, ctx.protocol
                )
            elif metric == "lr_sensitivity":
                c.nested = sensitivity_pair(
                    ctx.sensitivity[A.label], ctx.sensitivity[B.label], ctx.sensitivity_margin
                )
            else:
                worst = ctx.protocol is not None and ctx.protocol.failed_runs == "worst"
                c.nested = nested(A, B, ctx.test_seeds, ctx.margin, worst)
            _decide(c, ctx.ratio_margin, ctx.looks)
            out.append(c)
    for c, adjusted in zip(out, holm([1.0 if c.p is None else c.p for c in out]), strict=True):
        c.p_holm = adjusted
    for c in out:
        if c.a is not None:
            c.agreement = "running" if c.note.endswith("has not run") else _agreement(c)
    # the family again, each LR-sensitivity claim with L* its model size's best
    if ctx.sensitivity_size:
        again = []
        for c in out:
            if (
                c.a is not None
                and c.claim["metric"] == "lr_sensitivity"
                and c.agreement != "running"
            ):
                c.size = Checked(
                    c.claim,
                    c.a,
                    c.b,
                    nested=sensitivity_pair(
                        ctx.sensitivity_size[c.a], ctx.sensitivity_size[c.b], ctx.sensitivity_margin
                    ),
                )
                _decide(c.size, ctx.ratio_margin)
            again.append(c.size or c)
        for c, adjusted in zip(
            again, holm([1.0 if c.p is None else c.p for c in again]), strict=True
        ):
            if (
                c.a is not None
                and c.claim["metric"] == "lr_sensitivity"
                and c.agreement != "running"
            ):
                c.p_holm = adjusted
                c.agreement = _agreement(c)
    return out


def sensitivity_pair(a: Sensitivity, b: Sensitivity, margin: float) -> Nested:
    """A's per-seed LR sensitivity - B's, paired by seed."""
    p = paired(a.per_seed, b.per_seed, margin)
    sd = None if p.ci is None or p.mde is None else _sd(a.per_seed, b.per_seed)
    return Nested(
        None, p, [], tost_seeds_needed(margin, sd) if sd else None, f"over {len(a.lrs)} grid LRs"
    )


METRIC_WORDS = {
    "best_loss": "final val loss at each one's best LR",
    "common_loss": "final val loss at their common safe LR",
    "lr_sensitivity": "LR sensitivity (L* each arm's own best)",
    "lr50": "LR50",
}


def claim_sentence(c: Checked) -> str:
    """'**Paper**: says (expects A higher than B). A - B, ...: **agrees** (p = 0.004, Holm-adjusted
    0.012).'"""
    claim = c.claim
    head = f"**{claim['paper']}**: {claim['says']}"
    if c.a is None:
        return (
            f"{head}: **not run** (no arms of these runs match it; in the Holm family with p = 1)."
        )
    if c.agreement == "running":
        return f"{head}: **running** ({c.a} vs {c.b}: {c.note}; in the Holm family with p = 1)."
    expect = "the same as" if claim["expect"] == "same" else f"{claim['expect']} than"
    tests = (
        f" (p = {c.p:.2g}, Holm-adjusted {c.p_holm:.2g})"
        if c.p is not None
        else f" (no test: in the Holm family with p = 1, Holm-adjusted {c.p_holm:.2g})"
    )
    if c.ratio is not None:
        what = f"{c.a} over {c.b}: {c.ratio.describe()}"
    else:
        n = c.nested
        at = (
            f" at lr {g(n.lrs[0])} and {g(n.lrs[1])}"
            if n.lrs and n.lrs[0] != n.lrs[1]
            else (f" at lr {g(n.lrs[0])}" if n.lrs else "")
        )
        what = f"{c.a} - {c.b}, {METRIC_WORDS[claim['metric']]}{at}: {n.paired.describe()}"
        if claim["metric"] == "common_loss" and n.how:
            what += f"; the LR: {n.how}"
        if n.gaps and gap_text(n.gaps):
            what += f"; {gap_text(n.gaps)}"
        if n.rank is not None:
            r = n.rank
            what += (
                f"; failed runs kept in their pairs as the worst outcome ({r['failed'][0]} of "
                f"{c.a}, {r['failed'][1]} of {c.b}): {rank_shift(r)} over {r['n']} seeds "
                f"(median {r['median']:+.3f}), Wilcoxon signed-rank p = {r['p']:.2g} (this test "
                "decides)"
            )
        elif n.dropped:
            what += f"; left out: {', '.join(n.dropped)}"
    if c.note:
        what += f"; {c.note}"
    size = ""
    if c.size is not None:
        o = c.size
        size = (
            " With L* the best of any arm of the model size (secondary): "
            f"{o.nested.paired.describe()}: "
            f"**{o.agreement}**"
            + (f" (p = {o.p:.2g}, Holm-adjusted {o.p_holm:.2g})" if o.p is not None else "")
            + (
                ": **the verdict depends on L***."
                if o.agreement != c.agreement
                else ", the same verdict."
            )
        )
    if c.rules:
        size += (
            " Under the other pre-registered rules: "
            + "; ".join(f"{name}: {r.describe()}" for name, r in c.rules.items())
            + "."
        )
    expects = f"(expects {c.a} {expect} {c.b}, {claim['metric']})"
    return f"{head} {expects}. {what}: **{c.agreement}**{tests}.{size}"
