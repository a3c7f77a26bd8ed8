"""lab/protocol.py: the stages a study runs, driven by constructed outcomes (no training): the
grid brackets each arm's best LR and failure edge, refines next to both, adds failure seeds across
the edge and test seeds at the best LR chosen on the selection seeds only; and the study file's
protocol section is validated."""

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import protocol
from lab.studyfile import Protocol, load_study
from training.config import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "train"


@dataclass
class FakeRun:
    lr: float
    seed: int
    status: str
    final: float | None

    @property
    def trained(self):
        return self.status == "ok"

    @property
    def failed(self):
        return self.status == "collapsed"

    @property
    def finished(self):
        return True

    @property
    def loss(self):
        return self.final if self.trained else None


def outcome(lr: float, seed: int, best: float, edge: float) -> FakeRun:
    """A U-shaped loss in log10 lr around `best`; every run above `edge` collapses; seed 1 a bit
    worse."""
    if lr > edge:
        return FakeRun(lr, seed, "collapsed", 5.9)
    return FakeRun(lr, seed, "ok", 3.5 + (math.log10(lr / best)) ** 2 + 0.01 * seed)


def drive(study, best: float, edge: float):
    """Run the stages for one arm until the protocol asks for nothing more: [(stage, lrs,
    seeds)]."""
    p = study.protocol
    runs, made = [], []
    arm = protocol.arms_of(study)[0]
    for stage in protocol.STAGES:
        while True:
            specs = [
                s
                for s in protocol.wanted(study, stage, arm, runs)
                if s["name"] not in {m["name"] for m in made}
            ]
            if not specs:
                break
            made += specs
            new = []
            for s in specs:
                lr = float(
                    next(o.split("=")[1] for o in s["overrides"] if o.startswith("optim.lr="))
                )
                seed = int(
                    next(o.split("=")[1] for o in s["overrides"] if o.startswith("train.seed="))
                )
                new.append(outcome(lr, seed, best, edge))
            runs += new
            yield stage, sorted({r.lr for r in new}), sorted({r.seed for r in new})
    assert p is not None


@pytest.fixture
def study(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        f"config: {CONFIGS / 'tiny.yaml'}\ngrid: "
        f"{{norm: [rmsnorm], lr: [1.0e-3, 3.0e-3, 1.0e-2]}}\n"
        "protocol: {selection_seeds: [0, 1], test_seeds: [2, 3, 4], bracket: {factor: 3.1623, "
        "min_lr: 1.0e-4, max_lr: 1.0, steps: 3}, refine: 2.0}\n"
    )
    return load_study(path)


def test_the_stages_bracket_refine_and_test_where_the_outcomes_say(study):
    """Best LR 0.05 and failure above 0.2: the grid 1e-3..1e-2 has its best at the top edge and no
    failure, so the bracket extends up (0.0316, 0.1, 0.316: the last collapses), refine adds
    midpoints next to the best LR and across the edge, failure seeds go to every LR from the last
    all-trained to the first all-failed, and the test seeds to the best LR."""
    stages = list(drive(study, best=0.05, edge=0.2))
    names = [s for s, _, _ in stages]
    assert names[0] == "grid" and stages[0][1] == [1e-3, 3e-3, 1e-2] and stages[0][2] == [0, 1]
    extended = [lr for s, lrs, _ in stages if s == "bracket" for lr in lrs]
    assert extended == [0.0316, 0.1, 0.316]
    refined = [lr for s, lrs, _ in stages if s == "refine" for lr in lrs]
    # next to the best (0.0316 | 0.1) and across 0.1 | 0.316
    assert 0.0562 in refined and 0.178 in refined
    (edge,) = [(lrs, seeds) for s, lrs, seeds in stages if s == "edge"]
    assert edge == ([0.178, 0.316], [2, 3, 4])
    (test,) = [(lrs, seeds) for s, lrs, seeds in stages if s == "test"]
    assert test == ([0.0562], [2, 3, 4])  # the best of the selection seeds, tested on the others


def test_the_bracket_goes_down_and_stops_at_its_bounds(study):
    """Best LR below the grid: extended down until the best has a worse neighbour below; never below
    min_lr, never more than `steps` LRs beyond the grid; with no failure up to max_lr the edge stays
    open (no edge stage)."""
    stages = list(drive(study, best=4e-4, edge=10.0))
    down = [lr for s, lrs, _ in stages if s == "bracket" for lr in lrs if lr < 1e-3]
    up = [lr for s, lrs, _ in stages if s == "bracket" for lr in lrs if lr > 1e-2]
    assert down == [3.16e-4, 1e-4] and up == [
        0.0316,
        0.1,
        0.316,
    ]  # up: the failure edge is never crossed
    assert not [s for s, _, _ in stages if s == "edge"]


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "protocol: {selection_seeds: [0]}",
            "protocol is a mapping with selection_seeds and test_seeds",
        ),
        (
            "protocol: {selection_seeds: [0, 1], test_seeds: [1, 2]}",
            "must not appear among the test",
        ),
        (
            "protocol: {selection_seeds: [0], test_seeds: [1], bracket: {factor: 1.0}}",
            "protocol.bracket.factor=1.0 must be a finite number > 1",
        ),
        (
            "protocol: {selection_seeds: [0], test_seeds: [1], bracket: {width: 2}}",
            "protocol.bracket takes",
        ),
    ],
)
def test_bad_protocols_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(f"config: tiny.yaml\ngrid: {{lr: [1.0e-3]}}\n{text}\n")
    with pytest.raises(ConfigError, match=message):
        load_study(path)
    path.write_text(
        "config: tiny.yaml\ngrid: {lr: [1.0e-3], seed: [0]}\nprotocol: {selection_seeds: [0], "
        "test_seeds: [1]}\n"
    )
    with pytest.raises(ConfigError, match="no seed axis"):
        load_study(path)


def test_without_a_protocol_the_lowest_40_percent_of_seeds_choose():
    assert protocol.split_seeds([4, 0, 3, 1, 2], None) == ([0, 1], [2, 3, 4])
    assert protocol.split_seeds([0, 1, 2], None) == ([0], [1, 2]) and protocol.split_seeds(
        [0], None
    ) == ([0], [])


def test_seeds_split_and_print_in_numeric_order_past_9():
    # a string order put seed 10 among the lowest 40% (0, 1, 10, 11, 2, ...) and printed the test
    # seeds of a protocol as "10, 3, 4"
    assert protocol.split_seeds(range(12), None) == ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11])
    file = Protocol(
        selection_seeds=(0, 1, 2), test_seeds=(3, 4, 5, 6, 7, 8, 9, 10), failure_seeds=()
    )
    assert protocol.split_seeds([10, 9, 3, 0, 2, 1, 4, 5, 6, 7, 8], file) == (
        [0, 1, 2],
        [3, 4, 5, 6, 7, 8, 9, 10],
    )
    assert protocol.split_seeds([2, None, 0, 1], None) == ([0, 1], [2, None])
