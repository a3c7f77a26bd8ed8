"""A study file and its grid: load and validate it, expand the grid into runs (name, overrides), each run's
config validated before anything runs."""

from __future__ import annotations

import itertools
from pathlib import Path

from omegaconf import OmegaConf

from training.config import ConfigError, load_config

ALIASES = {"norm": "model.norm", "placement": "model.placement", "lr": "optim.lr", "seed": "train.seed",
           "seeds": "train.seed"}


STUDY_KEYS = {"name", "config", "overrides", "grid", "threads_per_worker", "workers", "equivalence_margin", "refine",
              "claims", "quick"}



def load_study(path: Path) -> dict:
    """The study file as a dict, with the grid's keys resolved to dotted config fields."""
    if not path.is_file():
        raise ConfigError(f"study file {str(path)!r} does not exist")
    try:
        study = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:
        raise ConfigError(f"cannot parse {str(path)!r}: {str(e).strip().splitlines()[0]}") from None
    if not isinstance(study, dict) or not isinstance(study.get("grid"), dict):
        raise ConfigError(f"{path}: a study is a mapping with a 'grid' mapping of config fields to value lists")
    unknown = set(study) - STUDY_KEYS
    if unknown:
        raise ConfigError(f"unknown study key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(STUDY_KEYS))}")
    if not study.get("grid"):
        raise ConfigError(f"{path}: a study needs a non-empty 'grid'")
    grid = {}
    for key, values in study["grid"].items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key} must be a non-empty list of values")
        grid[ALIASES.get(key, key)] = values
    study["grid"] = grid
    for key in ("threads_per_worker", "workers"):
        value = study.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{path}: {key} must be an integer >= 1, got {value!r}")
    refine = study.get("refine")
    if refine is not None:
        if not isinstance(refine, dict) or set(refine) - {"seeds", "neighbours"} or \
                not isinstance(refine.get("seeds"), list) or not refine["seeds"] or \
                not isinstance(refine.get("neighbours", 1), int) or refine.get("neighbours", 1) < 0:
            raise ConfigError(f"{path}: refine must be a mapping {{seeds: [list of seeds], neighbours: int >= 0}}")
        if "optim.lr" not in grid or "train.seed" not in grid:
            raise ConfigError(f"{path}: refine needs lr and seed axes in the grid (it adds seeds around each arm's "
                              f"best lr)")
    study["name"] = study.get("name") or path.stem
    study["config"] = str((path.parent / study.get("config", "default.yaml")).resolve())
    return study


def flatten(d: dict, prefix: str = "") -> list[str]:
    """{'train': {'steps': 5}} -> ['train.steps=5']."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += flatten(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={'null' if v is None else v}")
    return out


def _slug(key: str, value) -> str:
    short = {"model.norm": "", "model.placement": "", "optim.lr": "lr", "train.seed": "s"}
    return f"{short.get(key, key.rsplit('.', 1)[-1])}{value}"


def expand(study: dict, extra: list[str] = ()) -> list[dict]:
    """One {'name', 'overrides'} per grid combination, in grid order; every config validated up front."""
    base = flatten(study.get("overrides") or {}) + list(extra)
    runs = []
    keys = list(study["grid"])
    for values in itertools.product(*study["grid"].values()):
        name = "-".join(_slug(k, v) for k, v in zip(keys, values, strict=True))
        overrides = base + [f"{k}={v}" for k, v in zip(keys, values, strict=True)]
        load_config(study["config"], overrides)  # raises ConfigError on a bad value
        runs.append({"name": name, "overrides": overrides})
    return runs

