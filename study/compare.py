"""A study file's claims of the literature, checked against its runs: one primary test per claim and arm pair,
Holm-adjusted over the study (raw and adjusted p both reported).

- best_loss: each arm at its own best LR, chosen on the selection seeds, compared on the test seeds where both
  runs trained (nested: the seeds that chose an LR never test it); primary test: the paired t test (expect
  higher / lower) or TOST at the study's margin (expect same). A `same` claim whose test seeds are fewer than
  TOST needs at the observed spread gets an estimate with its CI and `cannot tell`, never a verdict.
- lr50: the two arms' failure curves fitted together (study/failure.py, lr50_ratio); primary test: the
  likelihood-ratio test of ratio = 1.

Agreement: `agrees` / `disagrees` when the Holm-adjusted p < 0.05 (the sign decides which); a `same` claim
`disagrees` when the whole 95% CI lies outside the margin; anything else `cannot tell`.
"""

from __future__ import annotations

from dataclasses import dataclass

from study.arms import Arm
from study.failure import RatioFit, lr50_ratio
from study.paired import ALPHA, Paired, holm, paired, tost_seeds_needed
from study.runs import same
from training.monitor import FINISHED


@dataclass
class Nested:
    """Two arms' losses, each at its own best LR (chosen on the selection seeds), paired over the test seeds."""

    lrs: tuple[float, float] | None
    paired: Paired
    dropped: list[str]  # test seeds left out because a run failed: "seed 3: A collapsed"
    needed: int | None = None  # seeds TOST needs at this spread for 80% power (None: more than 100,000 or no spread)


def nested(a: Arm, b: Arm, test_seeds, margin: float) -> Nested:
    """A - B on the test seeds, each arm at its best_lr, over the seeds where both runs trained."""
    if a.best_lr is None or b.best_lr is None:
        return Nested(None, paired({}, {}, margin), [])
    la, lb = a.losses(a.best_lr, test_seeds), b.losses(b.best_lr, test_seeds)
    dropped = []
    for arm, lr in ((a, a.best_lr), (b, b.best_lr)):
        dropped += [f"seed {r.seed}: {arm.label} {r.status}" for r in sorted(arm.at(lr), key=lambda r: str(r.seed))
                    if r.seed in test_seeds and r.loss is None]
    p = paired(la, lb, margin)
    sd = None if p.ci is None or p.mde is None else _sd(la, lb)
    return Nested((a.best_lr, b.best_lr), p, dropped, tost_seeds_needed(margin, sd) if sd else None)


def _sd(a: dict, b: dict) -> float:
    import statistics

    return statistics.stdev([a[s] - b[s] for s in sorted(set(a) & set(b), key=str)])


def ratio(a: Arm, b: Arm) -> RatioFit:
    """LR50_A / LR50_B over both arms' finished runs."""
    ra, rb = ([r for r in arm.runs if r.status in FINISHED] for arm in (a, b))
    return lr50_ratio([r.lr for r in ra], [r.failed for r in ra], [r.lr for r in rb], [r.failed for r in rb])


def claim_pairs(claim: dict, arms: dict[str, Arm], keys: list[str]) -> list[tuple[Arm, Arm]]:
    """The arm pairs (A, B) a claim compares: A has claim.a's values, B claim.b's; a field named on one side only
    takes the same value on the other; fields named on neither side must agree (one pair per combination)."""
    sides = {"a": {**claim["b"], **claim["a"]}, "b": {**claim["a"], **claim["b"]}}

    def fits(arm: Arm, side: str) -> bool:
        return all(same(arm.runs[0].config.get(k), v) for k, v in sides[side].items())

    free = [k for k in keys if k not in sides["a"]]
    return [(A, B) for A in arms.values() if fits(A, "a") for B in arms.values()
            if B is not A and fits(B, "b") and all(same(A.runs[0].config.get(k), B.runs[0].config.get(k))
                                                   for k in free)]


@dataclass
class Checked:
    claim: dict
    a: str | None
    b: str | None
    nested: Nested | None = None  # best_loss
    ratio: RatioFit | None = None  # lr50
    p: float | None = None  # the primary test's raw p
    p_holm: float | None = None
    agreement: str = "not run"

    @property
    def estimate(self) -> float | None:
        """A - B (nats) or LR50_A / LR50_B."""
        return self.ratio.ratio if self.ratio else (self.nested.paired.mean if self.nested else None)


def _primary(c: Checked) -> float | None:
    if c.ratio is not None:
        return c.ratio.p
    p = c.nested.paired
    if c.claim["expect"] == "same":
        return p.p_tost if c.nested.needed is not None and p.n >= c.nested.needed else None
    return p.p_diff


def _agreement(c: Checked) -> str:
    expect = c.claim["expect"]
    if c.ratio is not None:
        r = c.ratio
        higher = r.ratio > 1 if r.ratio is not None else (r.ci is not None and r.ci[0] is not None and r.ci[0] > 1)
        lower = r.ratio < 1 if r.ratio is not None else (r.ci is not None and r.ci[1] is not None and r.ci[1] < 1)
        if not (higher or lower) or c.p_holm is None or c.p_holm >= ALPHA:
            return "cannot tell"
        return "agrees" if higher == (expect == "higher") else "disagrees"
    p = c.nested.paired
    if p.ci is None:
        return "cannot tell"
    if expect == "same":
        if p.ci[0] > p.margin or p.ci[1] < -p.margin:
            return "disagrees"
        return "agrees" if c.p_holm is not None and c.p_holm < ALPHA else "cannot tell"
    if c.p_holm is None or c.p_holm >= ALPHA:
        return "cannot tell"
    return "agrees" if (p.mean > 0) == (expect == "higher") else "disagrees"


def check_claims(claims: list[dict], arms: dict[str, Arm], keys: list[str], test_seeds, margin: float) -> list[Checked]:
    """Each claim against these runs (one result per arm pair it names), Holm-adjusted over all of them."""
    out = []
    for claim in claims:
        pairs = claim_pairs(claim, arms, keys)
        if not pairs:
            out.append(Checked(claim, None, None))
        for A, B in pairs:
            c = Checked(claim, A.label, B.label)
            if claim["metric"] == "lr50":
                c.ratio = ratio(A, B)
            else:
                c.nested = nested(A, B, test_seeds, margin)
            c.p = _primary(c)
            out.append(c)
    tested = [c for c in out if c.p is not None]
    for c, adjusted in zip(tested, holm([c.p for c in tested]), strict=True):
        c.p_holm = adjusted
    for c in out:
        if c.a is not None:
            c.agreement = _agreement(c)
    return out


def claim_sentence(c: Checked, margin: float) -> str:
    """'**Paper**: says (expects A higher than B). A - B, ...: **agrees** (p = 0.004, Holm-adjusted 0.012).'"""
    claim = c.claim
    head = f"**{claim['paper']}**: {claim['says']}"
    if c.a is None:
        return f"{head}: **not run** (no arms of these runs match it)."
    expect = "the same as" if claim["expect"] == "same" else f"{claim['expect']} than"
    tests = f" (p = {c.p:.2g}, Holm-adjusted {c.p_holm:.2g})" if c.p is not None else ""
    if c.ratio is not None:
        what = f"{c.a} over {c.b}: {c.ratio.describe()}"
    else:
        n = c.nested
        at = f" at lr {n.lrs[0]:g} and {n.lrs[1]:g}" if n.lrs else ""
        what = f"{c.a} - {c.b}, final val loss{at} on the test seeds: {n.paired.describe()}"
        if n.dropped:
            what += f"; left out: {', '.join(n.dropped)}"
        if claim["expect"] == "same" and c.p is None and n.needed is not None:
            what += (f"; an estimate only: TOST at +-{margin:g} needs {n.needed} seeds at this spread for 80% power, "
                     f"the study has {n.paired.n}")
    return f"{head} (expects {c.a} {expect} {c.b}). {what}: **{c.agreement}**{tests}."
