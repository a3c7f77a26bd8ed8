"""The adaptive edge stage (docs/METHODS.md, "The adaptive edge stage"): after the grid, bracket,
refine and edge stages, rounds of new seeds at the LRs around each arm's current LR50 estimate, for
every LR50 claim its runs have not decided yet, until each is decided or its runs are spent.

A round is computed from the runs of the stages before it alone (the selection seeds, the failure
seeds at the edge LRs, the earlier rounds' seeds), so a rerun or a resume asks for the same runs,
and the rounds of all claims run in lockstep. A claim stops at a look where looks x p < alpha / m
(m: the Holm family's size), the level at which the final Holm analysis decides it whatever the
other claims' p. The final analysis is the ordinary likelihood over every run (lab/lr50.py; the
allocation depends on outcomes only, so the likelihood is the same), its p times the looks:
Bonferroni over the looks the stage could stop at, so stopping early cannot raise the rate of wrong
verdicts above alpha (tests/lab/test_adaptive.py simulates the design)."""

from __future__ import annotations

import math

from lab.lr50 import fit_failure_curve, lr50_ratio, lr50_test
from lab.studyfile import Adaptive


def center(lrs, failed, step: float, seek_edge: bool = False) -> float | None:
    """Where an arm's next round is centred: its LR50 where identified, else the middle of its
    bracket; with failures but no all-failed LR (or no all-trained one) Firth's LR50 held within a
    step of its runs, or with seek_edge its highest (lowest) LR, so that the round tries one step
    beyond; with no failure (or no success) one step beyond its runs; None without runs."""
    if not len(lrs):
        return None
    fit = fit_failure_curve(lrs, failed)
    if fit.identified:
        return fit.lr50
    (lo, hi), top, bottom = fit.bounds, max(lrs), min(lrs)
    if fit.failed == 0:
        return top * step
    if fit.failed == fit.n:
        return bottom / step
    if lo is not None and hi is not None:
        return math.sqrt(lo * hi)
    if seek_edge and hi is None:  # no all-failed LR: the round reaches one step above the top
        return top
    if seek_edge and lo is None:  # no all-trained LR: one step below the bottom
        return bottom
    if fit.lr50 is not None:  # mixed outcomes but no all-failed LR (or none all trained)
        return min(max(fit.lr50, bottom / step), top * step)
    return hi / step if hi is not None else (lo * step if lo is not None else top)


def round_lrs(mid: float, a: Adaptive) -> list[float]:
    """`a.lrs` LRs a.step apart centred on `mid` snapped to the powers of a.step (x1.78: 0.01,
    0.0178, 0.0316, ...), 3 significant digits."""
    k = round(math.log(mid) / math.log(a.step))
    half = a.lrs // 2
    return [float(f"{a.step ** (k + j):.3g}") for j in range(-half, half + 1)]


def decided(curve_a, curve_b, expect: str, ratio_margin: float, a: Adaptive, family: int) -> bool:
    """Whether an LR50 claim is decided at this look: its test (lab/lr50.py lr50_test) gives a
    verdict with looks x p < alpha / family. curve_*: (lrs, failed) of each arm's runs."""
    if not len(curve_a[0]) or not len(curve_b[0]):
        return False
    r = lr50_ratio(*curve_a, *curve_b, ci=False)
    p, direction, _ = lr50_test(r, expect, ratio_margin)
    return p is not None and direction is not None and p * a.looks < a.alpha / family


def round_plan(pairs, curve_of, a: Adaptive, family: int, margin: float) -> dict:
    """{arm: the LRs a round runs it at} for the LR50 claims not decided at this look: pairs is
    [(expect, arm A, arm B)], curve_of(arm) the (lrs, failed) of its runs before the round; {} when
    every claim is decided."""
    plan: dict = {}
    for expect, A, B in pairs:
        if decided(curve_of(A), curve_of(B), expect, margin, a, family):
            continue
        for arm in (A, B):
            mid = center(*curve_of(arm), a.step, a.seek_edge)
            if mid is not None:
                plan[arm] = sorted({*plan.get(arm, []), *round_lrs(mid, a)})
    return plan
