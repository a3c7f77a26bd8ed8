"""A study's result, computed once from its runs and its study file, before anything is written:
arms with the LR each chose on the selection seeds and its failure curve, the comparisons between
arms that differ in one field (LR50 ratio; nested loss difference), the claims, the exploratory
per-LR table. lab/report.py renders it."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from lab.arms import Arm, one_field_pairs, unstable
from lab.claims import Checked, Context, Nested, check_claims, nested, ratio
from lab.lr50 import FailureFit, RatioFit, lr50_ratio
from lab.paired import Paired, paired
from lab.protocol import floor, select_lr, split_seeds
from lab.read import Run, arm_bests, failure, find_runs, group_arms, judge
from lab.sensitivity import Sensitivity, sensitivities
from lab.studyfile import StudyFile, study_file
from lab.trend import trends
from training.rundir import read_json

INSTABILITY_RULE = "instability alone (slow runs censored)"


@dataclass
class Comparison:
    """Two arms that differ in exactly one config field."""

    a: Arm
    b: Arm
    key: str
    ratio: RatioFit  # LR50_A / LR50_B
    loss: Nested  # A - B at each one's best LR, on the test seeds


@dataclass
class StudyResult:
    file: StudyFile
    runs: list[Run]
    keys: list[str]  # the config fields that tell arms apart
    arms: dict[str, Arm]
    failures: dict[str, FailureFit]
    selection_seeds: list
    test_seeds: list
    comparisons: list[Comparison]
    claims: list[Checked]
    per_lr: list[
        tuple[Arm, Arm, str, float, Paired]
    ]  # exploratory: every shared LR, seeds where both trained
    wall_s: float | None
    trends: list = field(default_factory=list)  # lab/trend.py: comparisons along a numeric axis
    # {rule name: {arm label: FailureFit}}: the same runs, judged
    alternatives: dict = field(default_factory=dict)
    # {arm label: LR sensitivity, own L*}
    sensitivity: dict[str, Sensitivity] = field(default_factory=dict)
    # the same, L* the size's best
    sensitivity_size: dict[str, Sensitivity] = field(default_factory=dict)
    # LR50 for instability alone, slow censored
    instability: dict[str, FailureFit] = field(default_factory=dict)
    common_seeds: list = field(default_factory=list)
    # {budget (steps; None: the study's one): the first stage not run}: an interim report there
    running: dict = field(default_factory=dict)
    # lab/design.py: the designs the runs were made under, each with its runs' count
    designs: list = field(default_factory=list)
    # builds_of: what made the runs (torch, the kernels' build), each with its runs' count
    builds: list = field(default_factory=list)

    @property
    def margin(self) -> float:
        return self.file.margin


def wall_span(runs) -> float | None:
    """Seconds during which at least one run was in flight: the union of the runs' [start
    (meta.json), start + summary wall time] intervals, so a study run in stages at different times
    is not charged for the gap."""
    spans = []
    for r in runs:
        try:
            meta = read_json(r.path / "meta.json")
            start = time.mktime(time.strptime(meta["started"][:19], "%Y-%m-%dT%H:%M:%S"))
        except (OSError, ValueError, KeyError):
            continue
        spans.append((start, start + float(r.summary.get("wall_time_s") or 0)))
    if not spans:
        return None
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        total += max(0.0, e - max(s, end))
        end = max(end, e)
    return total


def builds_of(runs) -> list[dict]:
    """What made the runs, by how many (meta.json: torch and the fused kernels' build, whose name
    hashes the sources, flags, compiler and, for a -march=native build, the CPU): a study resumed
    on another machine (lab/pack.py) mixes builds whose numbers can differ in their last bits.
    Runs without a meta.json (archived) are not counted."""
    made = Counter()
    for r in runs:
        try:
            meta = read_json(r.path / "meta.json")
        except (OSError, ValueError):
            continue
        build = ((meta.get("kernels") or {}).get("build") or {}).get("name") or "no fused kernels"
        made[f"torch {meta.get('torch', '?')}, {build}"] += 1
    return [{"build": b, "runs": n} for b, n in sorted(made.items(), key=lambda x: (-x[1], x[0]))]


def compute(paths: list[Path], margin: float | None = None) -> StudyResult:
    """The result of the runs under `paths`; ValueError when there are none (or the study file is
    invalid)."""
    from training.config import ConfigError

    try:
        file = study_file(paths)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    runs = find_runs(paths, file.rule)
    running = next((r for p in paths if (r := sweep_running(p)) is not None), {})
    if not runs:
        raise ValueError(
            f"no run directories (with config.yaml) under {', '.join(map(str, paths))}"
        )
    if margin is not None:
        file.margin = margin
    res = compute_runs(runs, file, running)
    res.designs = designs_of(paths)
    res.builds = builds_of(runs)
    return res


def designs_of(paths: list[Path]) -> list[dict]:
    """The designs a study folder's runs were made under (design.json), each with how many of the
    runs sweep.json says were made under it; ValueError where the folder's study file is not its
    last design (lab/design.py check)."""
    from lab.design import check
    from lab.studyfile import load_study

    for p in paths:
        if (p / "study.yaml").is_file() and (p / "design.json").is_file():
            designs = check(p, load_study(p / "study.yaml"), str(p / "study.yaml"))
            made = {}
            for index in p.glob("sweep*.json"):
                for e in read_json(index).get("runs", []):
                    made[e["name"]] = e.get("design")
            for d in designs:
                d["runs"] = sum(h == d["hash"] for h in made.values())
            return designs
    return []


def sweep_running(path: Path) -> dict | None:
    """What a study's sweep.json says is still to run: {budget (steps; None: the whole study): the
    first stage not finished}, {} when its sweep finished; None without one (runs made by hand,
    an archive, a sweep from before this was recorded)."""
    index = path / "sweep.json"
    if not index.is_file():
        return None
    running = read_json(index).get("running")
    if running is None:
        return None
    return {(None if b == "all" else float(b)): stage for b, stage in running.items()}


def compute_runs(runs: list[Run], file: StudyFile, running: dict | None = None) -> StudyResult:
    """The result of these runs under this study file (its failure rule, claims, margins and
    protocol)."""
    judge(runs, file.rule)  # every run, live or archived, judged by the study file's rule
    keys, grouped = group_arms(runs)
    selection, test = split_seeds({r.seed for r in runs}, file.protocol)
    common_seeds = (
        [s for s in file.protocol.common_seeds if s in {r.seed for r in runs}]
        if file.protocol
        else []
    )
    arms = {label: Arm(label, rs) for label, rs in grouped.items()}
    for a in arms.values():
        a.best_lr = select_lr(a.runs, selection)
        a.floor = floor(a.runs, selection)
    grid = file.grid_lrs or tuple(sorted({r.lr for r in runs}))
    sens, sens_size = sensitivities(arms, grid), sensitivities(arms, grid, per_size=True)
    comparisons = [
        Comparison(a, b, key, ratio(a, b), nested(a, b, test, file.margin))
        for a, b, key in one_field_pairs(arms, keys)
    ]
    per_lr = [
        (a, b, key, lr, paired(a.losses(lr), b.losses(lr), file.margin))
        for a, b, key in one_field_pairs(arms, keys)
        for lr in a.lrs
        if lr in b.lrs
    ]
    running = running or {}
    ctx = Context(
        keys,
        test,
        selection,
        common_seeds,
        grid,
        file.margin,
        file.sensitivity_margin,
        file.ratio_margin,
        sens,
        sens_size,
        file.protocol.adaptive.looks if file.protocol and file.protocol.adaptive else 1,
        running,
        file.protocol,
    )
    res = StudyResult(
        file,
        runs,
        keys,
        arms,
        {k: a.failure() for k, a in arms.items()},
        selection,
        test,
        comparisons,
        check_claims(file.claims, arms, ctx),
        per_lr,
        wall_span(runs),
        sensitivity=sens,
        common_seeds=common_seeds,
        sensitivity_size=sens_size,
        running=running,
    )
    best = arm_bests(runs)
    rules = {
        rule.name: lambda r, rule=rule: failure(r, rule, best.get(id(r))) is not None
        for rule in file.alternatives
    }
    rules[INSTABILITY_RULE] = unstable
    # the same runs under each other rule: does a verdict depend on it?
    for name, failed in rules.items():
        fits = {k: a.failure(failed, selection) for k, a in arms.items()}
        if name == INSTABILITY_RULE:
            res.instability = fits
        else:
            res.alternatives[name] = fits
    for c in res.claims:
        if c.a is not None and c.claim["metric"] == "lr50" and c.agreement != "running":
            c.rules = {
                name: lr50_ratio(
                    *arms[c.a].curve(failed, selection), *arms[c.b].curve(failed, selection)
                )
                for name, failed in rules.items()
            }
    res.trends = trends(res)
    return res
