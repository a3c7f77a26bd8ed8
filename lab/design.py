"""A study folder remembers the design its runs were made under: design.json holds each design's
hash (the resolved study file, its `history:` notes aside, and the training config its runs start
from), when it was first used and, from the second on, what changed and the note that says why.

A sweep or a report whose study file no longer matches the folder's current design refuses in one
line naming what changed, unless the study file's `history:` has a note the recorded design did not
(what changed after results, and why): then the new design is recorded and the report says which
runs were made under which design (sweep.json's entries carry their design's hash). A training
config field the code gained since, at its default, is no change: the runs it makes are the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

from lab.studyfile import Study, flatten
from training.config import ConfigError, flat, load_config, to_dict
from training.rundir import read_json, write_text


def design_of(study: Study) -> dict:
    """{hash, study, config, notes}: what the runs of a loaded study file are made from."""
    body = study.design_body()  # its history notes and folder are not what runs
    # the config file by name: its resolved content is hashed below, and the checkout's path (a
    # pinned worktree, a moved clone) is not the design
    body["config"] = Path(study.config).name
    config = flat(to_dict(load_config(study.config, flatten(study.overrides or {}))))
    text = json.dumps({"study": body, "config": config}, sort_keys=True, default=_written)
    return {
        "hash": hashlib.sha256(text.encode()).hexdigest()[:12],
        "study": json.loads(json.dumps(body, default=_written)),
        "config": json.loads(json.dumps(config, default=str)),
        "notes": len(study.history),
    }


def _written(value) -> str:
    """A parsed section of the study file (Multiples, Rule, ...) as its repr, less the fields marked
    `added` in their metadata while they hold their defaults: a field the engine gained since, at
    its default, changes no run (as a training config field does not)."""
    if not dataclasses.is_dataclass(value):
        return str(value)
    shown = [
        f"{f.name}={getattr(value, f.name)!r}"
        for f in dataclasses.fields(value)
        if f.repr and not (f.metadata.get("added") and getattr(value, f.name) == f.default)
    ]
    return f"{type(value).__qualname__}({', '.join(shown)})"


def _defaults() -> dict:
    """The training config's defaults, flattened and as design.json keeps them."""
    return json.loads(json.dumps(flat(to_dict(load_config(None))), default=str))


def changes(old: dict, new: dict) -> list[str]:
    """What differs between two designs: the study file's keys (grid keys one level down) and the
    training config's fields."""
    out = []
    a, b = old["study"], new["study"]
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        if key == "grid" and isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            out += [
                f"grid.{g}"
                for g in sorted(set(a[key]) | set(b[key]))
                if a[key].get(g) != b[key].get(g)
            ]
        else:
            out.append(key)
    added = _defaults()  # a field the code gained since, at its default, changes no run
    fields = sorted(
        k
        for k in set(old["config"]) | set(new["config"])
        if old["config"].get(k) != new["config"].get(k)
        and not (k not in old["config"] and k in added and new["config"][k] == added[k])
    )
    if fields:
        out.append("the training config's " + ", ".join(fields))
    return out


def pin(study_dir: Path, study: Study, where: str, sets: list[str] = ()) -> str:
    """The design the folder's runs are made under from now on, recorded in design.json: the study
    file's current one (as its study.yaml keeps it, before --quick) and the sweep's --set
    overrides, where the folder has none yet, or where it is the folder's last one, or where the
    study file's `history:` has a new note saying why it changed; else ConfigError naming what
    changed. Its hash (of the file and config: a report, which sees no --set, checks that)."""
    design, path = design_of(study), study_dir / "design.json"
    design["set"] = list(sets)
    recorded = read_json(path)["designs"] if path.is_file() else []
    last = recorded[-1] if recorded else None
    if last and last["hash"] == design["hash"] and last.get("set", []) == design["set"]:
        return design["hash"]
    if recorded:
        changed = changes(recorded[-1], design)
        if last.get("set", []) != design["set"]:
            changed.append("the sweep's --set overrides")
        if not changed:  # only fields the code gained at their defaults: the same runs
            return last["hash"]
        if design["notes"] <= recorded[-1]["notes"]:
            raise ConfigError(
                f"{where}: the study file changed since its runs in {study_dir} were made "
                f"({', '.join(changed) or 'its layout'}); they would be reported as the new "
                "design's. Add a `history:` note to the study file saying what changed and why "
                "(the report then says which runs were made under which design), or sweep into "
                "another --out"
            )
        design["changed"] = changed
        design["why"] = str((study.history or [""])[-1])
    design["since"] = time.strftime("%Y-%m-%d %H:%M")
    write_text(path, json.dumps({"designs": [*recorded, design]}, indent=1) + "\n")
    return design["hash"]


def check(study_dir: Path, study: Study, where: str) -> list[dict]:
    """A report's check: the folder's designs, the last of which must be the study file's (its
    copy beside the runs, edited by hand, is refused with what changed); [] without design.json
    (folders made before designs were recorded)."""
    path = study_dir / "design.json"
    if not path.is_file():
        return []
    designs = read_json(path)["designs"]
    design = design_of(study)
    if designs[-1]["hash"] != design["hash"] and changes(designs[-1], design):
        raise ConfigError(
            f"{where}: the study file differs from the design the runs in {study_dir} were made "
            f"under ({', '.join(changes(designs[-1], design)) or 'its layout'}); sweep it again "
            "with a `history:` note saying why, so the report can say which runs were made under "
            "which design"
        )
    return designs
