"""The layout keeps its labels: lab/'s module map names every module once, the training defaults
have one source, and every study file is named as its study and its results folder."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import lab
from lab.studyfile import load_study
from training.config import Config, flat, load_config, to_dict

REPO = Path(__file__).resolve().parent.parent
DERIVED = {"model.vocab_size", "model.max_seq_len"}  # set from data.vocab_size and train.seq_len


def test_the_study_map_names_every_module_once():
    rows = [
        re.split(r"\s{2,}", line.strip())
        for line in lab.__doc__.strip().split("\n\n", 1)[1].splitlines()
    ]
    assert [r[0] for r in rows] == ["define", "run", "read", "analyse", "render"]
    names = [m for r in rows for m in r[1].split(", ")]
    assert sorted(names) == sorted(set(names)), "a module is named twice"
    files = sorted(p.stem for p in (REPO / "lab").glob("*.py") if p.stem != "__init__")
    assert sorted(names) == files
    assert len(lab.__doc__.strip().splitlines()) == 7  # a title, a blank line, five stages


def test_default_yaml_states_exactly_the_dataclass_defaults():
    """configs/train/default.yaml lists every field with the dataclasses' value: `python train.py`
    and load_config(None) build the same run."""
    yaml = flat(OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "train" / "default.yaml")))
    defaults = flat(to_dict(Config()))
    assert set(yaml) == set(defaults) - DERIVED, (
        "a field is missing from (or unknown to) default.yaml"
    )
    drift = {k: (defaults[k], v) for k, v in yaml.items() if v != defaults[k]}
    assert not drift, f"default.yaml and the dataclasses disagree (dataclass, yaml): {drift}"
    assert to_dict(load_config(None)) == to_dict(
        load_config(REPO / "configs" / "train" / "default.yaml")
    )


@pytest.mark.parametrize(
    "path", sorted((REPO / "lab" / "studies").glob("*.yaml")), ids=lambda p: p.stem
)
def test_a_study_file_is_named_as_its_study_and_says_what_it_asks(path):
    s = load_study(path)
    assert s.name == path.stem
    assert s.about and "\n" not in s.about


# Study files redesigned since their committed results were made: the copy beside the results is the
# design that made them until the study is rerun (then its entry goes, and the copies must agree
# again).
AWAITING_RERUN: dict[str, str] = {}


@pytest.mark.parametrize(
    "copy", sorted((REPO / "lab" / "results").glob("*/study.yaml")), ids=lambda p: p.parent.name
)
def test_a_committed_study_copy_is_its_config(copy):
    config = REPO / "lab" / "studies" / f"{copy.parent.name}.yaml"
    assert config.is_file(), f"{copy} has no study file lab/studies/{copy.parent.name}.yaml"
    if copy.parent.name in AWAITING_RERUN:
        assert copy.read_text() != config.read_text(), (
            f"{copy.parent.name} was rerun: remove it from AWAITING_RERUN"
        )
        return
    assert copy.read_text() == config.read_text()
