"""A study at fixed multiples of each arm's best LR (lab/studyfile.py `multiples:`)."""

import pytest

import train
from lab import studyfile
from training.config import ConfigError, load_config

STUDIES = train.REPO / "lab" / "studies"


def test_lr_multiples_runs_each_arm_at_its_best_lr_times_each_factor():
    """The grid's combinations (without validating 1,152 configs: one of each arm is loaded)."""
    study = studyfile.load_study(STUDIES / "lr-multiples.yaml")
    runs = list(studyfile._combinations(study))
    best = {"pre": 0.0316, "post": 0.01}
    fields = ("model.norm", "model.placement", "model.zero_mean_writers", "model.norm_impl")
    fields += ("optim.lr_factor",)
    arms, seeds, first = {}, [], {}
    for c in runs:
        arm = tuple(c[k] for k in fields)
        arms.setdefault(arm, set()).add((c["optim.lr"], c["train.seed"]))
        first.setdefault(arm, c)
        seeds.append(c["train.seed"])
        factor = c["optim.lr"] / best[c["model.placement"]]
        # the factor within the rounding to 3 significant figures
        assert min(abs(factor / f - 1) for f in (1, 3.1623, 5.6234, 10)) < 0.005
    assert len(runs) == 9 * 4 * 32 and len(arms) == 9
    assert all(len(v) == 4 * 32 for v in arms.values())
    assert seeds == sorted(seeds)  # seed by seed: a stopped study has whole pairs
    assert ("layernorm", "pre", False, "fused", 1.3) in arms  # the control
    assert ("layernorm", "post", False, "reference", 1.0) in arms  # post-norm's yardstick
    for c in first.values():
        overrides = studyfile.flatten(study.overrides) + [f"{k}={v}" for k, v in c.items()]
        cfg = load_config(study.config, overrides)
        assert cfg.optim.lr == c["optim.lr"] and cfg.model.dim == 32


def test_the_factor_of_a_run_is_read_back_from_its_lr():
    m = studyfile.Multiples((1.0, 3.1623, 5.6234, 10.0), (({}, 0.0316),), "here")
    for f in m.factors:
        assert m.factor(0.0316, studyfile.multiple_lr(0.0316, f)) == f


@pytest.mark.parametrize(
    "section, says",
    [
        ({"factors": [1, 3], "best_lr": [{"norm": "rmsnorm", "lr": 0.1}]}, "chosen"),
        ({"factors": [], "best_lr": [{"lr": 0.1}], "chosen": "x"}, "factors"),
        ({"factors": [1, 1], "best_lr": [{"lr": 0.1}], "chosen": "x"}, "twice"),
        ({"factors": [1], "best_lr": [{"norm": "dyt", "lr": 0.1}], "chosen": "x"}, "dyt"),
        ({"factors": [1], "best_lr": [{"norm": "rmsnorm", "lr": -1}], "chosen": "x"}, "lr"),
    ],
)
def test_a_bad_multiples_section_is_refused_naming_the_key(section, says):
    grid = {"model.norm": ["rmsnorm"], "train.seed": [0]}
    with pytest.raises(ConfigError, match=says):
        studyfile.parse_multiples(section, grid, "s.yaml")


def test_a_multiples_study_has_seeds_and_no_lr_axis():
    section = {"factors": [1], "best_lr": [{"lr": 0.1}], "chosen": "x"}
    with pytest.raises(ConfigError, match="no lr axis"):
        studyfile.parse_multiples(section, {"optim.lr": [0.1], "train.seed": [0]}, "s.yaml")
