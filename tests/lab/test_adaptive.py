"""The adaptive edge stage (lab/adaptive.py, lab/protocol.py adaptive_runs), driven by
constructed outcomes: rounds of new seeds at three LRs x1.78 apart around each arm's LR50 estimate,
in lockstep, until the LR50 claim is decided or its runs are spent; a resume asks for nothing new;
the claim's p carries the looks. The design's error rates and coverage:
lab/analyses/simulate_adaptive.py (its committed table is checked here, and a live prefix of it
reproduced)."""

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from lab import protocol
from lab.adaptive import center, round_lrs, round_plan
from lab.lr50 import fit_failure_curve, lr50_ratio, lr50_test
from lab.studyfile import Adaptive, load_study
from training.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "train"
SIM = REPO / "lab" / "results" / "simulations" / "adaptive.json"


@dataclass
class FakeRun:
    name: str
    lr: float
    seed: int
    failed: bool
    config: dict = field(default_factory=dict)
    finished: bool = True
    init_loss: float | None = None

    @property
    def trained(self):
        return not self.failed

    @property
    def final(self):  # a U-shaped loss around a best LR of 1e-3 (the edge stage reads it)
        return 4.0 + math.log10(self.lr / 1e-3) ** 2


def _value(spec: dict, key: str) -> str:
    return next(o.split("=", 1)[1] for o in reversed(spec["overrides"]) if o.startswith(key + "="))


def drive(study, outcome, upto="adaptive"):
    """Run the stages up to and including `upto` with outcome(norm, lr, seed) -> failed: the runs
    and [(stage, specs)] in order."""
    runs, made, log = [], set(), []
    for stage in protocol.STAGES[: protocol.STAGES.index(upto) + 1]:
        while True:
            specs = [s for s in protocol.stage_runs(study, stage, runs) if s["name"] not in made]
            if not specs:
                break
            made |= {s["name"] for s in specs}
            log.append((stage, specs))
            for s in specs:
                norm, lr, seed = (_value(s, k) for k in ("model.norm", "optim.lr", "train.seed"))
                runs.append(
                    FakeRun(
                        s["name"],
                        float(lr),
                        int(seed),
                        outcome(norm, float(lr), int(seed)),
                        {"model.norm": norm, "optim.lr": float(lr), "train.seed": int(seed)},
                    )
                )
    return runs, log


def study_file(tmp_path, adaptive="{seeds_per_round: 2, max_runs: 24, first_seed: 100}"):
    path = tmp_path / "s.yaml"
    path.write_text(
        f"config: {CONFIGS / 'tiny.yaml'}\n"
        "grid: {norm: [rmsnorm, layernorm], lr: [1.0e-3, 1.0e-2, 1.0e-1]}\n"
        "protocol: {selection_seeds: [0, 1, 2], test_seeds: [3, 4], failure_seeds: [3, 4], "
        f"refine: 0, bracket: {{steps: 0}}, adaptive: {adaptive}}}\n"
        "claims:\n  - {paper: p, says: s, a: {norm: rmsnorm}, b: {norm: layernorm}, "
        "metric: lr50, expect: same}\n"
    )
    return load_study(path)


def threshold(edges: dict):
    """Every seed of an arm fails above its edge LR: complete separation, never decided."""
    return lambda norm, lr, seed: lr > edges[norm]


@pytest.mark.slow
def test_a_round_is_three_lrs_x178_apart_around_each_arms_estimate_on_shared_new_seeds(tmp_path):
    study = study_file(tmp_path)
    runs, log = drive(study, threshold({"rmsnorm": 0.02, "layernorm": 0.02}))
    rounds = [specs for stage, specs in log if stage == "adaptive"]
    first = {
        (_value(s, "model.norm"), float(_value(s, "optim.lr")), int(_value(s, "train.seed")))
        for s in rounds[0]
    }
    # grid: 1e-2 trained, 1e-1 failed for both: bracket 0.01..0.1, middle 0.0316
    want = {
        (n, lr, s)
        for n in ("rmsnorm", "layernorm")
        for lr in (0.0178, 0.0316, 0.0562)
        for s in (100, 101)
    }
    assert first == want
    # separated arms are never decided: rounds until max_runs (24 = 2 rounds of 2 x 3 x 2) is spent
    assert len(rounds) == study.protocol.adaptive.rounds == 2
    assert {int(_value(s, "train.seed")) for s in rounds[1]} == {102, 103}
    assert sum(len(r) for r in rounds) == 24
    arm = {n: [r for r in runs if r.config["model.norm"] == n] for n in ("rmsnorm", "layernorm")}
    outcome = protocol.adaptive_outcome(
        arm["rmsnorm"], arm["layernorm"], "same", study.protocol, 2.0, 1
    )
    assert outcome == ("maximum spent (2 rounds)", 24)  # what the report says of it
    half = [r for r in arm["rmsnorm"] if r.seed < 102]  # as if round 2 had not run yet
    assert protocol.adaptive_outcome(
        half, [r for r in arm["layernorm"] if r.seed < 102], "same", study.protocol, 2.0, 1
    ) == ("not finished (round 2 not run yet)", 12)


@pytest.mark.slow
def test_a_decided_claim_stops_and_a_resume_asks_for_nothing_new(tmp_path):
    """Arms a decade apart, each with a rising curve: decided after the first round; the runs of
    later stages (test, common seeds) do not move the rounds: the finished study asks for none."""
    study = study_file(tmp_path, "{seeds_per_round: 4, max_runs: 240, first_seed: 100}")
    rng = np.random.default_rng(0)
    edges = {"rmsnorm": 0.003, "layernorm": 0.03}

    def curve(norm, lr, seed):
        x = math.log10(lr / edges[norm])
        return bool(rng.random() < 1 / (1 + math.exp(-6 * x)))

    runs, log = drive(study, curve, upto="common")
    rounds = [specs for stage, specs in log if stage == "adaptive"]
    assert 1 <= len(rounds) < study.protocol.adaptive.rounds
    assert protocol.adaptive_runs(study, runs) == [] or all(
        s["name"] in {r.name for r in runs} for s in protocol.adaptive_runs(study, runs)
    )
    ra = [r for r in runs if r.config["model.norm"] == "rmsnorm"]
    rb = [r for r in runs if r.config["model.norm"] == "layernorm"]
    fit = lr50_ratio(
        [r.lr for r in ra], [r.failed for r in ra], [r.lr for r in rb], [r.failed for r in rb]
    )
    p, direction, _ = lr50_test(fit, "same", 2.0)
    assert direction == "different" and p * study.protocol.adaptive.looks < 0.05
    ended, used = protocol.adaptive_outcome(ra, rb, "same", study.protocol, 2.0, 1)
    assert ended == f"decided after round {len(rounds)}"
    assert used == sum(len(r) for r in rounds)  # every run of its rounds, none of the later stages


def test_center_and_snapping():
    a = Adaptive(seeds_per_round=1, max_runs=6, first_seed=10)
    assert round_lrs(0.011, a) == [0.00562, 0.01, 0.0178]
    assert round_lrs(0.3, a) == [0.178, 0.316, 0.562]
    lrs = [1e-3, 1e-2, 1e-1] * 3
    assert center(lrs, [False] * 9, a.step) == pytest.approx(0.1 * a.step)  # nothing failed
    assert center(lrs, [True] * 9, a.step) == pytest.approx(1e-3 / a.step)  # everything failed
    separated = [lr > 0.02 for lr in lrs]
    assert center(lrs, separated, a.step) == pytest.approx(math.sqrt(1e-2 * 1e-1))
    assert center([], [], a.step) is None


def test_seek_edge_takes_a_round_past_a_mixed_top_lr_to_where_identification_needs_runs():
    """The pystdlib replication's pre-norm arm at 300 steps: all trained at 0.1, 3/20 failed at
    0.178, 23/25 at 0.316, no all-failed LR, so its LR50 is not identified (lab/lr50.py). Its
    rounds stayed at 0.1-0.316; with seek_edge the round reaches 0.562 (and, mirrored, below a
    mixed bottom LR); an identified or bracketed arm is centred as before."""
    a = Adaptive(seeds_per_round=4, max_runs=120, first_seed=100)
    seek = Adaptive(seeds_per_round=4, max_runs=120, first_seed=100, seek_edge=True)
    lrs = [0.1] * 39 + [0.178] * 20 + [0.316] * 25
    failed = [False] * 39 + [True] * 3 + [False] * 17 + [True] * 23 + [False] * 2
    assert not fit_failure_curve(lrs, failed).identified
    assert round_lrs(center(lrs, failed, a.step), a) == [0.1, 0.178, 0.316]
    assert round_lrs(center(lrs, failed, seek.step, True), seek) == [0.178, 0.316, 0.562]
    low = [1e-3] * 10 + [3e-3] * 10  # failures at the lowest LR: the edge lies below it
    low_failed = [True] * 2 + [False] * 8 + [True] * 10
    assert round_lrs(center(low, low_failed, seek.step, True), seek)[0] < 1e-3
    separated = [lr > 0.02 for lr in [1e-3, 1e-2, 1e-1] * 3]
    assert center([1e-3, 1e-2, 1e-1] * 3, separated, a.step, True) == pytest.approx(
        math.sqrt(1e-2 * 1e-1)
    )
    plan = round_plan([("same", "A", "B")], lambda arm: (lrs, failed), seek, family=24, margin=2.0)
    assert plan == {"A": [0.178, 0.316, 0.562], "B": [0.178, 0.316, 0.562]}


@pytest.mark.parametrize(
    "text,message",
    [
        ("{seeds_per_round: 2, max_runs: 24}", "needs first_seed"),
        ("{seeds_per_round: 2, max_runs: 24, first_seed: 4}", "above every other protocol seed"),
        ("{seeds_per_round: 2, max_runs: 6, first_seed: 100}", "max_runs >= 2 x lrs"),
        ("{seeds_per_round: 2, max_runs: 24, first_seed: 100, lrs: 2}", "an odd lrs"),
        ("{seeds_per_round: 2, max_runs: 24, first_seed: 100, alpha: 0.1}", "0.05"),
        ("{seeds_per_round: 2, max_runs: 24, first_seed: 100, rounds: 3}", "a mapping of"),
        (
            "{seeds_per_round: 2.5, max_runs: 24, first_seed: 100}",
            "seeds_per_round=2.5 must be an integer",
        ),
        ("{seeds_per_round: true, max_runs: 24, first_seed: 100}", "=True must be an integer"),
        ("{seeds_per_round: 2, max_runs: 24, first_seed: 100, step: .nan}", "step=nan must be"),
        ("{seeds_per_round: 2, max_runs: 24, first_seed: 100, seek_edge: 1}", "true or false"),
    ],
)
def test_bad_adaptive_sections_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        study_file(tmp_path, text)


@pytest.mark.slow
def test_the_claims_p_carries_the_looks(tmp_path):
    """check_claims multiplies an LR50 claim's raw p by the stage's looks (Bonferroni over them)."""
    from lab.arms import Arm
    from lab.claims import Context, check_claims

    rng = np.random.default_rng(1)
    arms = {}
    for label, edge in (("rmsnorm", 0.003), ("layernorm", 0.03)):
        rs = []
        for lr in (1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1):
            for seed in range(6):
                x = math.log10(lr / edge)
                rs.append(
                    FakeRun(
                        f"{label}-{lr}-{seed}",
                        lr,
                        seed,
                        bool(rng.random() < 1 / (1 + math.exp(-4 * x))),
                        {"model.norm": label},
                    )
                )
        arms[label] = Arm(label, rs)
    claim = {
        "paper": "p",
        "says": "s",
        "a": {"model.norm": "rmsnorm"},
        "b": {"model.norm": "layernorm"},
        "metric": "lr50",
        "expect": "lower",
    }

    def checked(looks):
        ctx = Context(["model.norm"], [], [0], [], (), 0.02, 0.1, 2.0, {}, {}, looks)
        return check_claims([claim], arms, ctx)[0]

    one, six = checked(1), checked(6)
    assert six.p == pytest.approx(min(1.0, 6 * one.p)) and six.looks == 6


def test_the_committed_simulation_meets_the_bounds_and_describes_the_default_studys_design():
    """lab/results/simulations/adaptive.json (lab/analyses/simulate_adaptive.py): coverage >= 0.93
    and wrong verdicts <= 5% in every scenario (true ratio 1, 2, 4), for the design the default
    study file states now."""
    sim = json.loads(SIM.read_text())
    study = load_study(REPO / sim["study"])
    a = study.protocol.adaptive
    assert sim["design"]["adaptive"] == {
        k: getattr(a, k)
        for k in ("seeds_per_round", "max_runs", "first_seed", "lrs", "step", "alpha")
    }
    assert sim["design"]["grid"] == list(study.grid["optim.lr"])
    assert {row["ratio"] for row in sim["rows"]} >= {1.0, 2.0, 4.0}
    for row in sim["rows"]:
        outcomes = row["studies"]
        assert len(outcomes) >= 200
        assert sum(o["covered"] for o in outcomes) / len(outcomes) >= 0.93, row["ratio"]
        assert sum(o["wrong"] for o in outcomes) / len(outcomes) <= 0.05, row["ratio"]


@pytest.mark.slow
def test_the_simulation_reproduces_the_first_committed_studies():
    """The committed outcomes are what the code computes now: the first two studies of each
    scenario, simulated again."""
    from lab.analyses.simulate_adaptive import design_of, outcome_row, simulate

    sim = json.loads(SIM.read_text())
    d = design_of(REPO / sim["study"])
    for i, row in enumerate(sim["rows"][:3]):
        again = simulate(d, row["ratio"], 2, row["slope"], sim["lr50"], seed=row["seed"])
        assert [outcome_row(o, row["ratio"], d.margin) for o in again] == row["studies"][:2], i
    assert re.match(r"\d", str(sim["reps"]))


def _drive_by(study, outcome, budgets):
    """The stages to the end, budget by budget (the sweep's order) or all at once ([None])."""
    runs, made, order = [], set(), []
    for budget in budgets:
        for stage in protocol.STAGES:
            while specs := [
                s
                for s in protocol.stage_runs(study, stage, runs, budget=budget)
                if s["name"] not in made
            ]:
                made |= {s["name"] for s in specs}
                order += [(s["name"], int(_value(s, "train.steps"))) for s in specs]
                for s in specs:
                    v = {k: _value(s, k) for k in ("model.norm", "optim.lr", "train.seed")}
                    steps = int(_value(s, "train.steps"))
                    lr, seed = float(v["optim.lr"]), int(v["train.seed"])
                    config = {"model.norm": v["model.norm"], "optim.lr": lr, "train.seed": seed}
                    failed = outcome(v["model.norm"], lr, seed, steps)
                    runs.append(
                        FakeRun(s["name"], lr, seed, failed, {**config, "train.steps": steps})
                    )
    return order


@pytest.mark.slow
def test_a_study_with_budgets_runs_each_budget_to_its_end_first_and_makes_the_same_runs(tmp_path):
    """Budget by budget, every stage of the shortest first: the same runs as all budgets at once
    (each budget's rounds are its own), and a study stopped early has its short budgets complete."""
    path = tmp_path / "s.yaml"
    path.write_text(
        f"config: {CONFIGS / 'tiny.yaml'}\n"
        "grid: {norm: [rmsnorm, layernorm], train.steps: [20, 10], lr: [1.0e-3, 1.0e-2, 1.0e-1]}\n"
        "protocol: {selection_seeds: [0, 1, 2], test_seeds: [3, 4], failure_seeds: [3, 4], "
        "common_seeds: [5, 6], refine: 0, bracket: {steps: 0}, "
        "adaptive: {seeds_per_round: 1, max_runs: 12, first_seed: 100}}\n"
        "claims:\n  - {paper: p, says: s, a: {norm: rmsnorm}, b: {norm: layernorm}, "
        "metric: lr50, expect: same}\n"
        "  - {paper: p, says: s, a: {norm: rmsnorm}, b: {norm: layernorm}, "
        "metric: common_loss, expect: same}\n"
    )
    study = load_study(path)
    edges = {("rmsnorm", 10): 0.01, ("layernorm", 10): 0.03, ("rmsnorm", 20): 0.02}

    def outcome(norm, lr, seed, steps):  # a rising curve, the same draw in any order
        x = math.log10(lr / edges.get((norm, steps), 0.02))
        u = np.random.default_rng([seed, steps, round(lr * 1e6)]).random()
        return bool(u < 1 / (1 + math.exp(-6 * x)))

    assert protocol.budgets(study) == [10, 20]
    by_budget = _drive_by(study, outcome, protocol.budgets(study))
    at_once = _drive_by(study, outcome, [None])
    assert sorted(by_budget) == sorted(at_once)
    steps = [b for _, b in by_budget]
    assert steps == sorted(steps)  # every run at 10 steps before any at 20
    assert {b for n, b in by_budget if "100" in n.rsplit("seed", 1)[-1]} == {10, 20}  # rounds ran
