"""A committed study decided again from its archived runs gives the numbers its report.json holds:
rendering changes pages, never results."""

import json
import math
import shutil
from pathlib import Path

import pytest

from lab.redecide import redecide

REPO = Path(__file__).resolve().parents[2]
# keys a re-decision writes anew (where it was decided from, its page) or adds (new fields)
REWRITTEN = {"decided_from", "page"}


def differences(old, new, path="") -> list[str]:
    """Where `new` departs from `old`: a number by more than 1e-6 (relative, or absolute near 0:
    the Firth fits' p near 1 move in the 8th digit), any other value at all. Keys only `new` has
    are additions, not differences."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{path}.{k}: missing" for k in old if k not in new and k not in REWRITTEN]
        for k in old.keys() & new.keys() - REWRITTEN:
            out += differences(old[k], new[k], f"{path}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} items, now {len(new)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    if isinstance(old, float | int) and isinstance(new, float | int) and not isinstance(old, bool):
        close = math.isclose(old, new, rel_tol=1e-6, abs_tol=1e-6)
        return [] if close else [f"{path}: {old} -> {new}"]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def test_differences_sees_a_changed_number_and_ignores_an_added_field():
    old = {"a": [1.0, {"p": 0.99999993}], "s": "x", "page": "report.md"}
    assert differences(old, {**old, "new": 1, "page": "decision.md"}) == []
    assert differences(old, {**old, "a": [1.0, {"p": 1.0}]}) == []  # 7e-8: the fit's noise
    assert differences(old, {**old, "a": [1.001, {"p": 0.99999993}]}) == [".a[0]: 1.0 -> 1.001"]
    assert differences(old, {"a": old["a"], "page": "x"}) == [".s: missing"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["horizon", "prmsnorm", "dyt-alpha"])
def test_a_committed_study_decided_again_keeps_every_number(tmp_path, name):
    folder = tmp_path / name
    shutil.copytree(REPO / "lab" / "results" / name, folder)
    committed = json.loads((folder / "report.json").read_text())
    redecide(folder)
    again = json.loads((folder / "report.json").read_text())
    assert differences(committed, again) == []
