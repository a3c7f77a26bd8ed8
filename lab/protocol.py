"""The study protocol: which runs a study makes, stage by stage, and which seeds choose and which
test (docs/METHODS.md, "A study's runs").

    grid     the study's LR grid on the selection seeds, for every arm
    bracket  per arm, the grid extended by `bracket.factor` (within min_lr..max_lr, at most
             `bracket.steps` LRs beyond each end of the grid) until the arm's best LR has a worse
             neighbour on both sides and its failure edge is crossed: an LR where every selection
             seed failed above one where every seed trained
    refine   per arm, the geometric midpoint wherever the best LR or the failure edge has a
             neighbour more than `refine` (x2) away
    edge     the failure seeds at every LR from the last where every selection seed trained to the
             first where every one failed, so the failure curve has >= 5 seeds where it rises
    critical per arm and `critical.seeds` seed, its critical LR by bisection (lab/critical.py): the
             arm's edge on the seed's own offset grid, then log midpoints until hi / lo <=
             `critical.resolution`; a stage that repeats until every seed is resolved
    test     the test seeds at each arm's best LR, chosen on the selection seeds alone (nested
             selection)
    common   for each `common_loss` claim's pair of arms, the common seeds at their common safe LR:
             the largest LR of the study's grid at which both arms' fitted P(fail) is below 5% at
             its upper one-sided 95% bound, from the runs of the other seeds (so it never moves once
             the common seeds have run)

Every stage is computed from the finished runs alone, so a rerun of the sweep makes the same
choices. A study with a budget axis (train.steps) runs every stage of its shortest budget before
the next budget's grid: each budget's arms are arms of their own, so the runs made are the same in
any order, and a study stopped early has its short budgets complete."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from pathlib import Path

from lab.adaptive import decided, round_plan
from lab.critical import bracket, grid_offset, next_lr
from lab.lr50 import p_fail_at, p_fail_upper
from lab.read import Run, find_runs, same
from lab.studyfile import Adaptive, Protocol, Study, excluded, expand
from lab.text import BUDGET

SAFE = 0.05  # the common LR: both arms' P(fail) below this at its upper one-sided 95% bound


def _seed_order(seed) -> tuple:
    """Seeds in numeric order (10 after 9, not after 1); a run without a seed (None) last."""
    number = isinstance(seed, (int, float)) and not isinstance(seed, bool)
    return (not number, seed if number else 0, str(seed))


def split_seeds(seeds, protocol: Protocol | None) -> tuple[list, list]:
    """(selection seeds, test seeds): the protocol's; for runs made without one, the lowest 40% of
    the seeds (at least one) choose and the rest test."""
    seeds = sorted(set(seeds), key=_seed_order)
    if protocol is not None:
        return [s for s in seeds if s in protocol.selection_seeds], [
            s for s in seeds if s in protocol.test_seeds
        ]
    k = max(1, round(0.4 * len(seeds)))
    return seeds[:k], seeds[k:]


# --- what one arm's runs say, on a set of seeds
# ---------------------------------------------------------------


def table(runs: list[Run], seeds) -> dict[float, list[Run]]:
    """{lr: the runs of these seeds} at every LR where every one of the seeds has a finished run."""
    out = {}
    for lr in sorted({r.lr for r in runs}):
        at = {r.seed: r for r in runs if r.lr == lr and r.seed in seeds}
        if seeds and set(seeds) <= set(at):
            out[lr] = [at[s] for s in seeds]
    return out


def trained(rs: list[Run]) -> bool:
    return all(r.trained for r in rs)


def all_failed(rs: list[Run]) -> bool:
    return all(r.failed for r in rs)


def floor(runs: list[Run], seeds) -> float | None:
    """The lowest LR at which every one of these seeds trained: below it a run that failed was too
    slow to learn within its budget, not unstable, so the failure curve (the upper edge) starts
    here."""
    ok = [lr for lr, rs in table(runs, seeds).items() if trained(rs)]
    return min(ok) if ok else None


def upper(runs: list[Run], seeds) -> list[Run]:
    """The finished runs from the floor up: what the failure curve and LR50 are fitted to."""
    low = floor(runs, seeds)
    return [r for r in runs if r.finished and (low is None or r.lr >= low)]


def common_lr(
    a: list[Run], b: list[Run], grid, seeds, exclude=(), rule: str = "bound", within: float = 0.1
) -> tuple[float | None, str]:
    """(the common safe LR of two arms, how it was chosen), from their runs on seeds other than
    `exclude` (the common seeds: an LR is never chosen on the seeds that compare at it, and it does
    not move once they have run): the largest LR of the grid, at or above both arms' floors, at
    which both arms' fitted P(fail) is below SAFE at its upper one-sided 95% bound; where no grid LR
    meets that (few runs bound P(fail) loosely), the largest grid LR at which every such run of both
    arms trained, said so. None where neither exists. rule "fitted" (protocol.common_lr: fitted):
    the largest grid LR at which both arms' fitted P(fail) point estimates are below SAFE and each
    arm's mean loss on the seeds is within `within` nats of its own best; None (the claim is not
    decided at a common LR) where no grid LR is both."""
    a = [r for r in a if r.seed not in exclude]
    b = [r for r in b if r.seed not in exclude]
    if rule == "fitted":
        return _fitted_common_lr(a, b, grid, seeds, within)
    ua, ub = upper(a, seeds), upper(b, seeds)
    lows = [floor(a, seeds), floor(b, seeds)]
    if not ua or not ub or None in lows:
        return None, "an arm has no LR where every selection seed trained"
    candidates = sorted((lr for lr in grid if lr >= max(lows)), reverse=True)
    for lr in candidates:
        bounds = [p_fail_upper([r.lr for r in u], [r.failed for r in u], lr) for u in (ua, ub)]
        if max(bounds) < SAFE:
            return lr, f"P(fail) upper 95% bounds {bounds[0]:.3f} and {bounds[1]:.3f} < {SAFE:g}"
    for lr in candidates:
        at = [r for r in (*a, *b) if r.lr == lr and r.finished]
        if at and all(r.trained for r in at):
            bounds = [p_fail_upper([r.lr for r in u], [r.failed for r in u], lr) for u in (ua, ub)]
            return lr, (
                f"no grid LR has both P(fail) upper 95% bounds < {SAFE:g}; the largest where every "
                "run of "
                f"both arms trained (bounds {bounds[0]:.3f}, {bounds[1]:.3f})"
            )
    return None, "no grid LR where every run of both arms trained"


def _fitted_common_lr(a, b, grid, seeds, within: float) -> tuple[float | None, str]:
    """common_lr's "fitted" rule (its docstring)."""
    fits, bests = [], []
    for runs in (a, b):
        u = upper(runs, seeds)
        fits.append(([r.lr for r in u], [r.failed for r in u]))
        scored = {lr: statistics.fmean(r.final for r in rs)
                  for lr, rs in table(runs, seeds).items() if trained(rs)}  # fmt: skip
        bests.append(scored)
    if not all(bests):
        return None, "an arm has no LR where every selection seed trained: not decided"
    for lr in sorted(grid, reverse=True):
        p = [p_fail_at(*fit, lr) for fit in fits]
        gaps = [s[lr] - min(s.values()) if lr in s else None for s in bests]
        if max(p) < SAFE and None not in gaps and max(gaps) <= within:
            return lr, (
                f"fitted P(fail) {p[0]:.3f} and {p[1]:.3f} < {SAFE:g}; each loss within "
                f"{within:g} nats of its best (+{gaps[0]:.3f}, +{gaps[1]:.3f})"
            )
    return None, (
        f"no grid LR has both fitted P(fail) < {SAFE:g} and each loss within {within:g} nats of "
        "its best: not decided at a common LR"
    )


def select_lr(runs: list[Run], seeds) -> float | None:
    """The LR with the lowest mean final val loss over these seeds, among the LRs where every one of
    them trained."""
    scored = [
        (statistics.fmean(r.final for r in rs), lr)
        for lr, rs in table(runs, seeds).items()
        if trained(rs)
    ]
    return min(scored)[1] if scored else None


def edge(runs: list[Run], seeds) -> tuple[float | None, float | None]:
    """(the last LR where every seed trained, the first above it where every seed failed)
    below/above the best LR; None where there is none."""
    t = table(runs, seeds)
    best = select_lr(runs, seeds)
    first_fail = next(
        (lr for lr, rs in t.items() if all_failed(rs) and (best is None or lr > best)), None
    )
    below = [lr for lr, rs in t.items() if trained(rs) and (first_fail is None or lr < first_fail)]
    return (max(below) if below else None), first_fail


def _round(lr: float) -> float:
    return float(f"{lr:.3g}")


def bracket_lrs(runs: list[Run], seeds, grid: list[float], p: Protocol) -> list[float]:
    """The next LR(s) beyond the tried ones this arm needs: below while its best LR is the lowest
    tried (or nothing trained), above while its best is the highest tried or no LR above it failed
    for every seed."""
    t = table(runs, seeds)
    if not t:
        return []
    tried, best = list(t), select_lr(runs, seeds)
    out = []
    below, above = sum(x < min(grid) for x in tried), sum(x > max(grid) for x in tried)
    # the k-th step beyond an end is that end x factor^k (not a chain of rounded products)
    lower, upper = (
        _round(min(grid) / p.factor ** (below + 1)),
        _round(max(grid) * p.factor ** (above + 1)),
    )
    if (best is None or best == tried[0]) and lower >= p.min_lr * (1 - 1e-9) and below < p.steps:
        out.append(lower)
    crossed = edge(runs, seeds)[1] is not None
    if (
        best is not None
        and (best == tried[-1] or not crossed)
        and upper <= p.max_lr * (1 + 1e-9)
        and above < p.steps
    ):
        out.append(upper)
    return out


def refine_lrs(runs: list[Run], seeds, p: Protocol) -> list[float]:
    """Geometric midpoints next to the best LR and across the failure edge where the spacing exceeds
    p.refine."""
    t = table(runs, seeds)
    best = select_lr(runs, seeds)
    if not p.refine or best is None:
        return []
    tried = list(t)
    i = tried.index(best)
    pairs = [(tried[j], tried[j + 1]) for j in (i - 1, i) if 0 <= j < len(tried) - 1]
    ok, fail = edge(runs, seeds)
    if ok is not None and fail is not None:
        pairs.append((ok, fail))
    return sorted({_round(math.sqrt(a * b)) for a, b in pairs if b / a > p.refine * (1 + 1e-9)})


def edge_lrs(runs: list[Run], seeds) -> list[float]:
    """The LRs where the failure curve rises: from the last where every seed trained to the first
    where every one failed (to the highest tried when no LR failed for every seed but some runs
    failed)."""
    t = table(runs, seeds)
    ok, fail = edge(runs, seeds)
    if ok is None or not any(r.failed for rs in t.values() for r in rs):
        return []
    return [lr for lr in t if ok <= lr and (fail is None or lr <= fail)]


# --- the stages
# ------------------------------------------------------------------------------------------------


def arms_of(study: Study) -> list[dict]:
    """Every combination of the grid's values other than the LR and the seed that the study does not
    exclude: {field: value}."""
    axes = {k: v for k, v in study.grid.items() if k not in ("optim.lr", "train.seed")}
    arms = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    return [arm for arm in arms if not excluded(study, arm)]


def runs_of(arm: dict, runs: list[Run]) -> list[Run]:
    return [r for r in runs if all(same(r.config.get(k), v) for k, v in arm.items())]


def specs(study: Study, arm: dict, lrs, seeds, extra=()) -> list[dict]:
    """The run specs ({'name', 'overrides'}) of one arm at these LRs and seeds, named as the grid
    names them."""
    grid = {k: ([arm[k]] if k in arm else v) for k, v in study.grid.items()}
    grid["optim.lr"], grid["train.seed"] = list(lrs), list(seeds)
    return expand(dataclasses.replace(study, grid=grid), extra) if lrs and seeds else []


STAGES = ("grid", "bracket", "refine", "edge", "critical", "adaptive", "test", "common")


def critical_lrs(runs: list[Run], seed: int, p: Protocol) -> list[float]:
    """The next LR one seed's bisection of its critical LR wants (lab/critical.py): none before the
    selection seeds give the arm an edge; then the edge's two LRs on the seed's own offset grid,
    kept within bracket.min_lr..max_lr (a wide edge's offset would carry them past the cap);
    then bisection to protocol.critical.resolution. [] when resolved, censored (stable at max_lr,
    unstable at min_lr) or not monotone in the LR (the report says so)."""
    mine = [r for r in runs if r.seed == seed and r.finished]
    if not mine:
        ok, fail = edge(runs, p.selection_seeds)
        if ok is None or fail is None:
            return []
        off = grid_offset(seed, fail / ok)
        inside = lambda lr: min(p.max_lr, max(p.min_lr, lr))  # noqa: E731  (the study's LR range)
        return sorted({_round(inside(ok * off)), _round(inside(fail * off))})
    try:
        b = bracket({r.lr: r.failed for r in mine})
    except ValueError:
        return []
    lr = next_lr(b, p.critical.resolution, p.max_lr, p.min_lr)
    return [] if lr is None else [_round(lr)]


def arm_pairs(study: Study, claim: dict) -> list[tuple[dict, dict]]:
    """The arm pairs (as {field: value}) a claim compares: A has claim.a's values, B claim.b's; a
    field named on one side only takes the same value on the other; the fields named on neither side
    are equal in A and B."""
    sides = {"a": {**claim["b"], **claim["a"]}, "b": {**claim["a"], **claim["b"]}}
    arms = arms_of(study)
    fits = lambda arm, side: all(same(arm.get(k), v) for k, v in sides[side].items())  # noqa: E731
    free = [k for k in (arms[0] if arms else {}) if k not in sides["a"]]
    return [
        (A, B)
        for A in arms
        if fits(A, "a")
        for B in arms
        if B is not A and fits(B, "b") and all(same(A.get(k), B.get(k)) for k in free)
    ]


def common_runs(study: Study, runs: list[Run], extra=()) -> list[dict]:
    """The common stage's run specs: each common_loss claim's pair at its common LR, on the common
    seeds."""
    p: Protocol = study.protocol
    out = []
    for claim in study.claims:
        if claim["metric"] != "common_loss":
            continue
        for A, B in arm_pairs(study, claim):
            lr, _ = common_lr(
                runs_of(A, runs),
                runs_of(B, runs),
                study.grid["optim.lr"],
                p.selection_seeds,
                p.common_seeds,
                p.common_rule,
                p.common_within,
            )
            if lr is not None:
                out += specs(study, A, [lr], p.common_seeds, extra) + specs(
                    study, B, [lr], p.common_seeds, extra
                )
    return out


def _before(arm_runs: list, r: int, p: Protocol) -> list:
    """The arm's finished runs that the stages before round r made, from its floor up (what its
    failure curve is fitted to in the report): selection seeds, failure seeds at the edge LRs
    (both computed from the selection seeds alone) and the seeds of rounds 0..r-1."""
    sel, a = p.selection_seeds, p.adaptive
    edge = set(edge_lrs(arm_runs, sel))
    earlier = {s for k in range(r) for s in a.seeds(k)}
    low = floor(arm_runs, sel)
    return [
        x
        for x in arm_runs
        if x.finished
        and (low is None or x.lr >= low)
        and (x.seed in sel or (x.seed in p.failure_seeds and x.lr in edge) or x.seed in earlier)
    ]


def _curve(runs: list) -> tuple[list, list]:
    return [x.lr for x in runs], [x.failed for x in runs]


def adaptive_outcome(
    arm_a: list, arm_b: list, expect: str, p: Protocol, margin: float, family: int
) -> tuple[str, int]:
    """How the adaptive stage ended for one LR50 claim, from its arms' runs: decided at which look,
    its maximum spent, or not finished; and the runs its rounds made at its two arms."""
    a, used = p.adaptive, 0
    for r in range(a.rounds + 1):
        curves = [_curve(_before(arm, r, p)) for arm in (arm_a, arm_b)]
        if decided(*curves, expect, margin, a, family):
            return ("decided before any round" if r == 0 else f"decided after round {r}"), used
        if r == a.rounds:
            return f"maximum spent ({a.rounds} rounds)", used
        mine = [x for x in arm_a + arm_b if x.seed in a.seeds(r) and x.finished]
        if not mine:
            return f"not finished (round {r + 1} not run yet)", used
        used += len(mine)
    raise AssertionError("unreachable")


def round_runs(arm_a: list, arm_b: list, a: Adaptive) -> int:
    """Every finished run of the adaptive rounds at a claim's two arms (what the stage spent there,
    whichever claim asked for it)."""
    seeds = {s for r in range(a.rounds) for s in a.seeds(r)}
    return sum(x.seed in seeds and x.finished for x in arm_a + arm_b)


def adaptive_runs(study: Study, runs: list, extra=(), budget=None) -> list[dict]:
    """The adaptive stage's run specs given the finished runs: the first round some of whose runs
    are not finished yet, for the LR50 claims undecided before it (lab/adaptive.py); [] when every
    claim is decided or spent, or the study has no such stage. With a budget, only the claims'
    pairs at that budget (their rounds are their own; the Holm family stays the whole study's)."""
    p = study.protocol
    a: Adaptive | None = p.adaptive
    claims = study.claims
    arms = {}  # the arms by a hashable key
    pairs = []
    for c in claims:
        for A, B in arm_pairs(study, c) if c["metric"] == "lr50" else []:
            if budget is not None and not same(A.get(BUDGET), budget):
                continue
            ka, kb = (tuple(sorted(arm.items())) for arm in (A, B))
            arms |= {ka: A, kb: B}
            pairs.append((c["expect"], ka, kb))
    if a is None or not pairs:
        return []
    family = sum(max(1, len(arm_pairs(study, c))) for c in claims)
    margin = float(study.ratio_margin or 2.0)
    done = {x.name for x in runs if x.finished}
    for r in range(a.rounds):
        before = {k: _curve(_before(runs_of(arm, runs), r, p)) for k, arm in arms.items()}
        plan = round_plan(pairs, before.get, a, family, margin)
        want = {
            s["name"]: s
            for k, lrs in plan.items()
            for s in specs(study, arms[k], lrs, a.seeds(r), extra)
        }
        if not want:
            return []
        if not set(want) <= done:
            return list(want.values())
    return []


def wanted(study: Study, stage: str, arm: dict, runs: list[Run], extra=()) -> list[dict]:
    p: Protocol = study.protocol
    sel, grid = p.selection_seeds, study.grid["optim.lr"]
    if stage == "grid":
        return specs(study, arm, grid, sel, extra)
    if stage == "bracket":
        return specs(study, arm, bracket_lrs(runs, sel, grid, p), sel, extra)
    if stage == "refine":
        return specs(study, arm, refine_lrs(runs, sel, p), sel, extra)
    if stage == "edge":
        return specs(study, arm, edge_lrs(runs, sel), p.failure_seeds, extra)
    if stage == "critical":
        seeds = p.critical.seeds if p.critical else ()
        return [
            s
            for seed in seeds
            for s in specs(study, arm, critical_lrs(runs, seed, p), [seed], extra)
        ]
    if stage == "test":
        best = select_lr(runs, sel)
        return specs(study, arm, [best] if best is not None else [], p.test_seeds, extra)
    return []  # adaptive, common: for pairs of arms (adaptive_runs, common_runs)


def budgets(study: Study) -> list:
    """The study's budgets, shortest first; [None] for a study without a budget axis."""
    values = study.grid.get(BUDGET, [])
    return sorted(values) if len(values) > 1 else [None]


def budget_of(spec: dict) -> float | None:
    """A run spec's budget (its train.steps override); None without one."""
    key = BUDGET + "="
    value = next((o[len(key) :] for o in reversed(spec["overrides"]) if o.startswith(key)), None)
    return None if value is None else float(value)


def stage_runs(study: Study, stage: str, runs: list[Run], extra=(), budget=None) -> list[dict]:
    """Every run spec a stage wants, given the finished runs (all arms; with a budget, that
    budget's arms)."""
    if stage == "adaptive":
        return adaptive_runs(study, runs, extra, budget)
    if stage == "common":
        out = common_runs(study, runs, extra)
    else:
        out = [
            s
            for arm in arms_of(study)
            for s in wanted(study, stage, arm, runs_of(arm, runs), extra)
        ]
    return [s for s in out if budget is None or same(budget_of(s), budget)]


def next_stage(
    study: Study, study_dir: Path, made: list[dict], extra=(), up_to: int | None = None
) -> tuple[str, list[dict]] | None:
    """(the stage, its runs not yet made) for the first stage that still wants runs, budget by
    budget (shortest first), given the finished runs in study_dir; None when the study is complete.
    `made`: the run specs launched so far (none is asked for twice); `up_to`: no budget above
    these steps."""
    runs = find_runs([study_dir], study.rule) if (study_dir / "runs").is_dir() else []
    names = {r["name"] for r in made}
    for budget in budgets(study):
        if None not in (up_to, budget) and budget > up_to:
            break
        for stage in STAGES:
            more: list[dict] = []
            for s in stage_runs(study, stage, runs, extra, budget):
                if s["name"] not in names and s["name"] not in {m["name"] for m in more}:
                    more.append(s)
            if more:
                return stage, more
    return None


def first_runs(study: Study, extra=()) -> list[dict]:
    """The runs a sweep starts with: the grid (on the selection seeds, with a protocol)."""
    if study.protocol is None:
        return expand(study, extra)
    return stage_runs(study, "grid", [], extra)
