"""The adaptive edge stage (lab/adaptive.py) simulated on two arms with known failure curves: how
often its final verdict on an LR50 claim ("the same within x m") is wrong, how often the interval
the report prints covers the true ratio, and how many runs it spends, when the true LR50s are equal
and when they differ by x2 and x4. The design is the study file's: its LR grid, selection and
failure seeds (the grid and edge stages, lab/protocol.py), its `protocol.adaptive` rounds and the
size of its Holm family; each run fails with P = 1 / (1 + exp(-slope (log10 lr - log10 LR50))).

    python lab/analyses/simulate_adaptive.py lab/studies/norm-placement-lr.yaml --reps 200 \\
        --save lab/results/simulations/adaptive.md     (and adaptive.json: every simulated study)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.adaptive import round_plan
from lab.lr50 import lr50_ratio, lr50_test
from lab.paired import ALPHA
from lab.protocol import arm_pairs, edge_lrs
from lab.studyfile import Adaptive, load_study
from training.config import number
from training.rundir import write_text


@dataclass
class SimRun:
    arm: str
    lr: float
    seed: int
    failed: bool
    final: float  # a U-shaped loss whose best LR is a decade below the arm's LR50 (edge() reads it)
    finished: bool = True

    @property
    def trained(self) -> bool:
        return not self.failed


@dataclass
class Design:
    grid: tuple
    selection_seeds: tuple
    failure_seeds: tuple
    adaptive: Adaptive
    family: int  # the Holm family's size: a claim stops at looks x p < alpha / family
    margin: float  # ratio_margin


def design_of(path: Path) -> Design:
    study = load_study(path)
    p = study.protocol
    if p is None or p.adaptive is None:
        sys.exit(f"error: {path} has no protocol.adaptive section to simulate")
    family = sum(max(1, len(arm_pairs(study, c))) for c in study.claims)
    return Design(
        tuple(study.grid["optim.lr"]),
        p.selection_seeds,
        p.failure_seeds,
        p.adaptive,
        family,
        float(study.ratio_margin or 2.0),
    )


@dataclass
class Outcome:
    verdict: str  # agrees | disagrees | cannot tell
    covered: bool  # the printed interval (CI where identified, else the brackets) holds the truth
    identified: bool
    runs: int
    rounds: int


def study_once(d: Design, lr50_a: float, lr50_b: float, slope: float, rng) -> Outcome:
    """One simulated study of one LR50 claim (A vs B, expect same): grid, edge, adaptive rounds,
    then the report's analysis."""
    truth = {"a": lr50_a, "b": lr50_b}
    runs: list[SimRun] = []

    def draw(arm: str, lr: float, seeds) -> None:
        x = math.log10(lr) - math.log10(truth[arm])
        p = 1 / (1 + math.exp(-slope * x))
        runs.extend(SimRun(arm, lr, s, bool(rng.random() < p), 4 + (x + 1) ** 2) for s in seeds)

    def curve(arm: str) -> tuple[list, list]:
        rs = [r for r in runs if r.arm == arm]
        return [r.lr for r in rs], [r.failed for r in rs]

    for arm in truth:
        for lr in d.grid:
            draw(arm, lr, d.selection_seeds)
    for arm in truth:
        for lr in edge_lrs([r for r in runs if r.arm == arm], d.selection_seeds):
            draw(arm, lr, d.failure_seeds)
    a, rounds = d.adaptive, 0
    for r in range(a.rounds):
        plan = round_plan([("same", "a", "b")], curve, a, d.family, d.margin)
        if not plan:
            break
        rounds += 1
        for arm, lrs in plan.items():
            for lr in lrs:
                draw(arm, lr, a.seeds(r))
    fit = lr50_ratio(*curve("a"), *curve("b"))
    p, direction, _ = lr50_test(fit, "same", d.margin)
    verdict = "cannot tell"
    if p is not None and direction is not None and min(1.0, a.looks * p) < ALPHA:
        verdict = "agrees" if direction == "same" else "disagrees"
    lo, hi = fit.ci if fit.identified else fit.bounds
    ratio = lr50_a / lr50_b
    covered = (lo is None or lo <= ratio) and (hi is None or ratio <= hi)
    return Outcome(verdict, covered, fit.identified, len(runs), rounds)


def simulate(d: Design, ratio: float, reps: int, slope: float, lr50_b: float, seed: int = 0):
    """[Outcome] of `reps` studies whose true LR50s are lr50_b x ratio and lr50_b."""
    rng = np.random.default_rng(seed)
    return [study_once(d, lr50_b * ratio, lr50_b, slope, rng) for _ in range(reps)]


def wrong(ratio: float, margin: float, verdict: str) -> bool:
    """A verdict the truth contradicts: `agrees` when the ratio is at or beyond the margin (the
    TOST null holds there), `disagrees` when it is at or inside it."""
    inside = 1 / margin - 1e-12 < ratio < margin + 1e-12
    at_edge = abs(math.log(ratio)) >= math.log(margin) - 1e-12
    return (verdict == "agrees" and at_edge) or (verdict == "disagrees" and inside)


def outcome_row(o: Outcome, ratio: float, margin: float) -> dict:
    """One simulated study as the committed JSON keeps it."""
    return {
        "verdict": o.verdict,
        "wrong": wrong(ratio, margin, o.verdict),
        "covered": o.covered,
        "identified": o.identified,
        "runs": o.runs,
        "rounds": o.rounds,
    }


def table(d: Design, rows: list[tuple[float, float, list[Outcome]]]) -> str:
    out = [
        "| true ratio | slope (logit / decade) | studies | agrees | disagrees | cannot tell | "
        "wrong | coverage | identified | runs per study: median (max) | rounds: mean |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ratio, slope, res in rows:
        n = len(res)
        count = {
            v: sum(o.verdict == v for o in res) for v in ("agrees", "disagrees", "cannot tell")
        }
        bad = sum(wrong(ratio, d.margin, o.verdict) for o in res)
        runs = sorted(o.runs for o in res)
        out.append(
            f"| {ratio:g} | {slope:g} | {n} | {count['agrees'] / n:.3f} | "
            f"{count['disagrees'] / n:.3f} | {count['cannot tell'] / n:.3f} | {bad / n:.3f} | "
            f"{sum(o.covered for o in res) / n:.3f} | {sum(o.identified for o in res) / n:.3f} | "
            f"{runs[n // 2]} ({runs[-1]}) | {sum(o.rounds for o in res) / n:.2f} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", type=Path, help="a study file with a protocol.adaptive section")
    ap.add_argument(
        "--reps", type=number(int, ">= 1"), default=200, help="simulated studies per scenario"
    )
    ap.add_argument("--ratios", type=number(float, "> 0"), nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument(
        "--slopes", type=number(float, "> 0"), nargs="+", default=[9.4], help="logit per decade"
    )
    ap.add_argument("--lr50", type=number(float, "> 0"), default=0.01, help="arm B's true LR50")
    ap.add_argument("--save", type=Path, help="also write the table to this markdown file")
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    d = design_of(a.study)
    t0 = time.time()
    scenarios = [(r, s) for s in a.slopes for r in a.ratios]
    rows = [(r, s, simulate(d, r, a.reps, s, a.lr50, seed=i)) for i, (r, s) in enumerate(scenarios)]
    ad = d.adaptive
    text = (
        f"`python lab/analyses/simulate_adaptive.py {a.study} --reps {a.reps}` "
        f"({time.time() - t0:.0f} s)\n\n"
        f"Design: grid {', '.join(f'{x:g}' for x in d.grid)} x {len(d.selection_seeds)} selection "
        f"seeds, {len(d.failure_seeds)} failure seeds across the edge, then up to {ad.rounds} "
        f"rounds of {ad.seeds_per_round} seeds at {ad.lrs} LRs x{ad.step:.3g} apart per arm "
        f"(max {ad.max_runs} runs a claim), {ad.looks} looks, a claim stops at looks x p < "
        f"{ad.alpha:g} / {d.family}; verdict: looks x p < {ALPHA:g} (one claim); margin "
        f"x{d.margin:g}; arm B's LR50 {a.lr50:g}.\n\n" + table(d, rows) + "\n"
    )
    print(text)
    if a.save:
        write_text(a.save, text)
        ad = d.adaptive
        keep = {
            "study": str(a.study),
            "reps": a.reps,
            "lr50": a.lr50,
            "design": {
                "grid": list(d.grid),
                "selection_seeds": list(d.selection_seeds),
                "failure_seeds": list(d.failure_seeds),
                "family": d.family,
                "margin": d.margin,
                "adaptive": {
                    k: getattr(ad, k)
                    for k in ("seeds_per_round", "max_runs", "first_seed", "lrs", "step", "alpha")
                },
            },
            "rows": [
                {
                    "ratio": r,
                    "slope": s,
                    "seed": i,
                    "studies": [outcome_row(o, r, d.margin) for o in res],
                }
                for i, (r, s, res) in enumerate(rows)
            ],
        }
        write_text(a.save.with_suffix(".json"), json.dumps(keep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
