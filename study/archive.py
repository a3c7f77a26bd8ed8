"""Runs of a committed study whose run directories are gone, read back from its report.md ("## Runs": name,
status, final and best val loss, L0 per run) and the study file beside it, so that its claims can be decided
again when the protocol changes (scripts/redecide.py).

What an archived run lacks: its curves. Reports written before `collapsed` existed called every run that never
got below the unigram level `plateau`, whether it was still falling (LR too low) or stuck (LR too high). Read
back, such a run counts as `collapsed` (a failure) when its LR lies above the lowest LR at which its arm has an
`ok` run, and as `plateau` otherwise: the reading the curves gave wherever both labels were recorded.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from study.runs import Run, judged
from study.studyfile import expand, load_study
from training.config import Config, flat, to_dict

ROW = re.compile(r"^\| (?P<name>[^|]+?) \| (?P<status>[a-z]+)[^|]* \| (?P<final>[^|]*) \| (?P<best>[^|]*) \| "
                 r"(?P<div>[^|]*) \| (?P<l0>[^|]*) \|")


def _number(text: str) -> float | None:
    text = text.strip()
    return None if text in ("", "-") else float(text.replace(",", ""))


def archived_runs(folder: Path, study_file: Path, seeds=range(10)) -> list[Run]:
    """The runs of a committed study: from folder/runs.json where the report wrote one (configs, outcomes and val
    curves, judged again with the current rules), else from report.md's Runs table, their configs rebuilt from
    their names (the grid of `study_file` crossed with `seeds`, named as the sweep names them)."""
    if (folder / "runs.json").is_file():
        out = []
        for e in json.loads((folder / "runs.json").read_text()):
            config = {**flat(to_dict(Config())), **e["config"]}
            records = [{"step": s, "val/loss": v} for s, v in e["val"]]
            summary = {**e["summary"], "status": judged(config, e["summary"], records)}
            out.append(Run(e["name"], folder, config, summary, records))
        return out
    study = load_study(study_file)
    grid = {**study["grid"], "train.seed": list(seeds)}
    names = {}
    for spec in expand({**study, "grid": grid}):
        cfg = dict(o.split("=", 1) for o in spec["overrides"] if "=" in o)
        names[spec["name"]] = {k: _parse(cfg[k]) for k in grid}
    text = (folder / "report.md").read_text()
    rows = itertools.takewhile(lambda line: line.startswith("|"),
                               text.split("## Runs\n\n", 1)[1].splitlines()) if "## Runs" in text else []
    runs = []
    for line in rows:
        m = ROW.match(line)
        if not m or m["name"] in ("run", "---") or m["name"].startswith("-"):
            continue
        config = names.get(m["name"])
        if config is None:
            raise ValueError(f"{folder}: run {m['name']!r} is not a run of {study_file}'s grid")
        summary = {"status": m["status"], "final_val_loss": _number(m["final"]), "best_val_loss": _number(m["best"])}
        runs.append(Run(m["name"], folder, config, summary, [{"step": 0, "val/loss": _number(m["l0"])}]))
    _split_plateaus(runs, [k for k in grid if k not in ("optim.lr", "train.seed")])
    return runs


def _parse(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(value, value)


def _split_plateaus(runs: list[Run], arm_keys: list[str]) -> None:
    """Old `plateau` runs above the lowest LR where their arm has an `ok` run become `collapsed` (module doc)."""
    arm = lambda r: tuple(str(r.config.get(k)) for k in arm_keys)  # noqa: E731
    lowest_ok = {}
    for r in runs:
        if r.status == "ok":
            lowest_ok[arm(r)] = min(lowest_ok.get(arm(r), r.lr), r.lr)
    for r in runs:
        if r.status == "plateau" and arm(r) in lowest_ok and r.lr > lowest_ok[arm(r)]:
            r.summary["status"] = "collapsed"
