"""Paired critical learning rates (docs/METHODS.md, "Critical LR"): per seed and arm, the smallest
LR at which the seed's run is unstable, found by bisection on a log scale; arms compared by the
mean of paired log differences over seeds, with a t interval, and "same" decided by TOST.

A seed's runs under two arms that differ only in the norm share its data order and initial weights,
so its two critical LRs are a pair. Bisection on a log grid quantizes each estimate to a cell of
width log(resolution); each seed's grid is offset by its own fraction of a cell (`offset`), which
makes the mean of quantized differences unbiased for the true one whatever the cell width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from lab.arms import one_field_pairs


@dataclass(frozen=True)
class Bracket:
    """What a seed's runs say about its critical LR: the largest LR it trained at (lo) and the
    smallest it failed at (hi); None where no run says (censored)."""

    lo: float | None
    hi: float | None

    def estimate(self) -> float | None:
        """The geometric midpoint of the bracket; None while one side is missing."""
        return None if None in (self.lo, self.hi) else math.sqrt(self.lo * self.hi)


def bracket(outcomes: dict[float, bool]) -> Bracket:
    """The bracket of one seed's runs {lr: unstable}; ValueError when they are not monotone (an
    unstable run below a stable one: the critical LR is not one number for this seed)."""
    stable = [lr for lr, bad in outcomes.items() if not bad]
    unstable = [lr for lr, bad in outcomes.items() if bad]
    lo, hi = max(stable, default=None), min(unstable, default=None)
    if lo is not None and hi is not None and hi < lo:
        raise ValueError(f"outcomes are not monotone in the LR: unstable at {hi:g} < {lo:g} stable")
    return Bracket(lo, hi)


def next_lr(b: Bracket, resolution: float, cap: float, floor: float) -> float | None:
    """The next LR to run for a seed, or None when it is resolved (hi / lo <= resolution) or
    censored (stable at the cap, unstable at the floor). From one side only it steps by x4 (at most
    to cap or floor); within a bracket it halves the log width."""
    if b.lo is None and b.hi is None:
        return math.sqrt(cap * floor)
    if b.hi is None:
        return None if b.lo >= cap else min(cap, b.lo * 4)
    if b.lo is None:
        return None if b.hi <= floor else max(floor, b.hi / 4)
    return None if b.hi / b.lo <= resolution * (1 + 1e-9) else math.sqrt(b.lo * b.hi)


def grid_offset(seed: int, resolution: float) -> float:
    """The seed's grid offset, a factor in [1, resolution): a fixed, pre-registered function of the
    seed (golden-ratio sequence), not a random draw."""
    return resolution ** ((seed * 0.6180339887498949) % 1.0)


@dataclass(frozen=True)
class Paired:
    """The comparison of two arms' critical LRs over seeds (a / b)."""

    n: int  # seeds with both estimates
    censored: int  # seeds left out: an estimate missing in either arm
    ratio: float  # exp(mean paired log difference)
    ci: tuple[float, float]  # the ratio's two-sided (1 - alpha) t interval
    p_equivalence: float  # TOST p at +-log(margin)
    p_difference: float  # two-sided t test p for a ratio of 1
    verdict: str  # agrees | differs | inconclusive
    sd: float = 0.0  # the paired log differences' sd (what sizes the next study's seeds)
    ci90: tuple[float, float] = (1.0, 1.0)  # the ratio's 1 - 2 alpha interval (TOST's)

    def bound(self, alpha: float = 0.05) -> float:
        """The narrowest margin TOST accepts at alpha: exp of the 1 - 2 alpha interval's farthest
        end from 0 (a ratio beyond it either way is ruled out)."""
        lo, hi = (math.log(x) for x in self.ci90)
        return math.exp(max(abs(lo), abs(hi)))

    def detectable(self, power: float = 0.8, alpha: float = 0.05) -> float:
        """The smallest ratio (> 1) this n and sd detect by the two-sided t test with this power:
        exp((t_{1-alpha/2} + t_power) sd / sqrt n), n - 1 df (the usual approximation: the
        noncentral t's power at it is within a point or two of `power`)."""
        t = stats.t(self.n - 1)
        return math.exp((t.ppf(1 - alpha / 2) + t.ppf(power)) * self.sd / math.sqrt(self.n))


def compare(
    a: dict[int, float | None],
    b: dict[int, float | None],
    margin: float = 1.1,
    alpha: float = 0.05,
) -> Paired:
    """Arms a and b ({seed: critical LR or None}) by their paired log differences: `agrees` when the
    TOST p at +-log(margin) is below alpha (the 1 - 2 alpha interval inside the margin); else
    `differs` when the two-sided t test rejects a ratio of 1; else `inconclusive`. The ratio and its
    1 - alpha interval say how large. Needs two or more complete pairs (ValueError)."""
    seeds = sorted(set(a) | set(b))
    d = [math.log(a[s] / b[s]) for s in seeds if a.get(s) and b.get(s)]
    n = len(d)
    if n < 2:
        raise ValueError(f"{n} seeds with a critical LR in both arms: at least 2 are needed")
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    m = math.log(margin)
    if se == 0:  # every seed the same difference: exact
        p_eq = 0.0 if abs(mean) < m else 1.0
        p_diff = 1.0 if mean == 0 else 0.0
        lo = hi = mean
    else:
        t = stats.t(n - 1)
        p_eq = max(t.sf((mean + m) / se), t.cdf((mean - m) / se))
        p_diff = 2 * t.sf(abs(mean) / se)
        half = t.ppf(1 - alpha / 2) * se
        lo, hi = mean - half, mean + half
    verdict = "agrees" if p_eq < alpha else "differs" if p_diff < alpha else "inconclusive"
    half90 = 0.0 if se == 0 else stats.t(n - 1).ppf(1 - alpha) * se
    ci, ci90 = (math.exp(lo), math.exp(hi)), (math.exp(mean - half90), math.exp(mean + half90))
    return Paired(n, len(seeds) - n, math.exp(mean), ci, p_eq, p_diff, verdict, sd, ci90)


def arm_estimates(runs, seeds) -> dict[int, float | None]:
    """{seed: its critical LR (the bracket's geometric midpoint), None where censored or not
    monotone} from one arm's finished runs (lab/read.py Run: lr, seed, failed)."""
    out = {}
    for seed in seeds:
        mine = {r.lr: r.failed for r in runs if r.seed == seed and r.finished}
        try:
            out[seed] = bracket(mine).estimate() if mine else None
        except ValueError:
            out[seed] = None
    return out


KNOWN = "optim.lr_factor"  # a pair that differs only in this has a known critical-LR ratio


def known_ratio(a, b) -> float:
    """The critical-LR ratio a / b of two arms that differ only in optim.lr_factor: a run at lr with
    factor k trains at k lr, so a's critical LR (as filed) is b's x factor_b / factor_a."""
    return float(b.runs[0].config.get(KNOWN, 1.0)) / float(a.runs[0].config.get(KNOWN, 1.0))


def pooled_bands(runs, seeds) -> dict[int, float]:
    """{seed: its largest stable LR / its smallest unstable one, both at the LR the runs train at
    (lr x optim.lr_factor); > 1 where the seed's outcomes are not monotone in that LR, else 1}
    for seeds with both outcomes."""
    out = {}
    for seed in seeds:
        at = [
            (r.lr * float(r.config.get(KNOWN) or 1.0), r.failed)
            for r in runs
            if r.seed == seed and r.finished
        ]
        stable = [lr for lr, bad in at if not bad]
        unstable = [lr for lr, bad in at if bad]
        if stable and unstable:
            out[seed] = max(1.0, max(stable) / min(unstable))
    return out


def comparisons(res) -> list[dict]:
    """Each pair of arms that differ in one key (the norm first), compared by paired critical LRs
    (report.json's `critical`, what the README's sentences read): labels, key, the Paired numbers
    and the bounds they give; for an optim.lr_factor pair its known ratio and the pooled bands.
    [] where the protocol bisects no critical LRs."""
    p = res.file.protocol
    if p is None or p.critical is None:
        return []
    c = p.critical
    label = {id(arm): name for name, arm in res.arms.items()}
    pairs = sorted(one_field_pairs(res.arms, res.keys), key=lambda pair: pair[2] != "model.norm")
    out = []
    for a, b, key in pairs:
        row = {"a": label[id(a)], "b": label[id(b)], "key": key, "margin": c.margin}
        try:
            q = compare(arm_estimates(a.runs, c.seeds), arm_estimates(b.runs, c.seeds), c.margin)
        except ValueError as e:
            out.append(row | {"error": str(e)})
            continue
        row |= {
            "n": q.n,
            "censored": q.censored,
            "ratio": q.ratio,
            "ci": list(q.ci),
            "sd": q.sd,
            "p_tost": q.p_equivalence,
            "p": q.p_difference,
            "verdict": q.verdict,
            "detectable": q.detectable(),
            "bound": q.bound(),
        }
        if key == KNOWN:
            bands = pooled_bands(a.runs + b.runs, c.seeds)
            row |= {"known": known_ratio(a, b), "bands": list(bands.values())}
        out.append(row)
    return out


def findings(res) -> list[str]:
    """The report's lines on paired critical LRs (comparisons): each pair's ratio, CI and its width,
    n and censored seeds, the paired sd and the ratio it detects, TOST and t-test p, the verdict and
    the narrowest margin TOST accepts; for an optim.lr_factor pair, whether its known ratio is in
    the CI and how many seeds' pooled outcomes are not monotone in the LR they train at."""
    rows = comparisons(res)
    if not rows:
        return []
    c = res.file.protocol.critical
    out = [
        f"Paired critical LRs (protocol.critical: seeds {', '.join(map(str, c.seeds))}, bisection "
        f"to x{c.resolution:g}, each seed's grid offset; failure rule: {res.file.rule.describe()}"
        f"): a / b over seeds, TOST at x{c.margin:g}."
    ]
    for r in rows:
        head = f"- **{r['a']}** / **{r['b']}** (differ in {r['key']})"
        if "error" in r:
            out.append(f"{head}: not decided ({r['error']}).")
            continue
        known = ""
        if "known" in r:
            inside = "inside" if r["ci"][0] <= r["known"] <= r["ci"][1] else "outside"
            wide = [w for w in r["bands"] if w > 1]
            known = (
                f"; the known ratio {r['known']:.3f} is {inside} the CI. Pooled at the LR each run "
                f"trains at (lr x lr_factor), {len(wide)} of {len(r['bands'])} seeds are not "
                "monotone in it"
                + (
                    f" (a seed trained up to x{max(wide):.2f} above an LR it failed at)"
                    if wide
                    else ""
                )
            )
        lo, hi = r["ci"]
        # the TOST bound says what a pair that did not differ rules out; beside `differs` it reads
        # as an equivalence
        bound = (
            ""
            if r["verdict"] == "differs"
            else f"; rules out more than x{r['bound']:.2f} either way"
        )
        out.append(
            f"{head}: {r['ratio']:.3f} (95% CI {lo:.3f}-{hi:.3f}, width x{hi / lo:.2f}), n = "
            f"{r['n']} seeds ({r['censored']} censored or not monotone), paired log sd "
            f"{r['sd']:.3f} (detects x{r['detectable']:.2f} with power 0.8), TOST p = "
            f"{r['p_tost']:.3g}, t-test p = {r['p']:.3g}: **{r['verdict']}**{bound}{known}."
        )
    return out
