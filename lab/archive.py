"""Runs of a committed study whose run directories are gone, read back so that its claims can be
decided again when the protocol changes (lab/redecide.py): from its runs.json (configs, outcomes
and val curves) where the report wrote one, else from report.md's Runs table (name, status, final
and best val loss, L0 per run) and the study file.

The study's failure rule judges them as it judges live runs (lab/read.py failure). What a
table-only run lacks is its curve: the rule's any-eval criteria then read its final eval (a spike it
recovered from cannot be seen), while "did not learn" reads its best eval exactly; the unigram
entropy comes from the study's prepared data. No label is changed by hand: a verdict rests only on
what the committed data show."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import re
from pathlib import Path

from lab.read import Run, judged
from lab.studyfile import Study, expand, flatten, load_study
from training.config import Config, flat, load_config, to_dict
from training.rundir import read_json

ROW = re.compile(
    r"^\| (?P<name>[^|]+?) \| (?P<status>[a-z]+)[^|]* \| (?P<final>[^|]*) \| (?P<best>[^|]*) \| "
    r"(?P<div>[^|]*) \| (?P<l0>[^|]*) \|"
)


def _number(text: str) -> float | None:
    text = text.strip()
    return None if text in ("", "-") else float(text.replace(",", ""))


RUNS = "runs.json.gz"  # every run's config, outcome and val curve, gzipped (a tenth the size)


def runs_file(folder: Path) -> Path | None:
    """A committed study's runs: runs.json.gz, or runs.json (written before it was compressed)."""
    for name in (RUNS, "runs.json"):
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def read_runs(folder: Path) -> list[dict] | None:
    """The entries of a study folder's runs file (None without one); ValueError naming a damaged
    one."""
    path = runs_file(folder)
    if path is None:
        return None
    if path.suffix != ".gz":
        return read_json(path)
    try:
        return json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path} is damaged ({e}): restore it from git") from None


def runs_bytes(entries: list[dict]) -> bytes:
    """runs.json.gz's content: the same bytes for the same runs (no timestamp in the header)."""
    return gzip.compress((json.dumps(entries) + "\n").encode(), compresslevel=9, mtime=0)


def archived_runs(folder: Path, study_file: Path, seeds=range(10)) -> list[Run]:
    """The runs of a committed study: from folder/runs.json where the report wrote one (configs,
    outcomes and val curves, judged again with the current rules), else from report.md's Runs table,
    their configs rebuilt from their names (the grid of `study_file` crossed with `seeds`, named as
    the sweep names them)."""
    entries = read_runs(folder)
    if entries is not None:
        out = []
        for e in entries:
            config = {**flat(to_dict(Config())), **e["config"]}
            records = [{"step": s, "val/loss": v} for s, v in e["val"]]
            summary = {**e["summary"], "status": judged(config, e["summary"], records)}
            out.append(Run(e["name"], folder, config, summary, records))
        return out
    study = load_study(study_file)
    unigram = _unigram(study)
    grid = {**study.grid, "train.seed": list(seeds)}
    names = {}
    for spec in expand(dataclasses.replace(study, grid=grid)):
        cfg = dict(o.split("=", 1) for o in spec["overrides"] if "=" in o)
        names[spec["name"]] = {k: _parse(cfg[k]) for k in grid}
    text = (folder / "report.md").read_text()
    rows = (
        itertools.takewhile(
            lambda line: line.startswith("|"), text.split("## Runs\n\n", 1)[1].splitlines()
        )
        if "## Runs" in text
        else []
    )
    runs = []
    for line in rows:
        m = ROW.match(line)
        if not m or m["name"] in ("run", "---") or m["name"].startswith("-"):
            continue
        config = names.get(m["name"])
        if config is None:
            raise ValueError(f"{folder}: run {m['name']!r} is not a run of {study_file}'s grid")
        summary = {
            "status": m["status"],
            "final_val_loss": _number(m["final"]),
            "best_val_loss": _number(m["best"]),
            "unigram_entropy": unigram,
        }
        runs.append(
            Run(m["name"], folder, config, summary, [{"step": 0, "val/loss": _number(m["l0"])}])
        )
    return runs


def _unigram(study: Study) -> float | None:
    """The unigram entropy of the study's training data (its prepared data's meta.json; prepared if
    need be, by train.prepare)."""
    import train

    cfg = load_config(study.config, flatten(study.overrides or {}))
    return json.loads((train.prepare(cfg) / "meta.json").read_text()).get("unigram_entropy")


def _parse(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(value, value)
