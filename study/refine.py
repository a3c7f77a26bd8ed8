"""The second stage of a study: more seeds where the comparisons are made.

A coarse LR grid with few seeds finds each arm's best LR; the paired comparisons need more seeds than the
grid can afford everywhere. `refine: {seeds: [...], neighbours: k}` in the study file adds, for every arm of
the grid, runs with those seeds at the union over arms of each arm's best LR and its k grid neighbours on each
side (a union, so that arms are compared at the same LRs). The choice is made from the finished first-stage
runs only, so a rerun of the sweep makes the same one.
"""

from __future__ import annotations

from pathlib import Path

from study.grid import expand
from study.runs import find_runs, group_arms
from study.stats import Arm


def refine_lrs(study_dir: Path, grid_lrs: list[float], neighbours: int) -> list[float]:
    """The union over arms of each arm's best LR and its `neighbours` grid neighbours on each side."""
    runs = find_runs([study_dir])
    if not runs:
        return []
    _, grouped = group_arms(runs)
    lrs = sorted(grid_lrs)
    chosen = set()
    for label, arm_runs in grouped.items():
        best = Arm(label, arm_runs).best_lr
        if best is not None and best in lrs:
            i = lrs.index(best)
            chosen.update(lrs[max(0, i - neighbours): i + neighbours + 1])
    return sorted(chosen)


def refined_runs(study: dict, first: list[dict], study_dir: Path,
                 extra: list[str] = ()) -> tuple[list[float], list[dict]]:
    """(the chosen LRs, the second-stage runs not already in `first`)."""
    refine = study["refine"]
    lrs = refine_lrs(study_dir, study["grid"]["optim.lr"], int(refine.get("neighbours", 1)))
    if not lrs:
        return [], []
    grid = {**study["grid"], "optim.lr": lrs, "train.seed": list(refine["seeds"])}
    names = {r["name"] for r in first}
    return lrs, [r for r in expand({**study, "grid": grid}, extra) if r["name"] not in names]
