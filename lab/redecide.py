"""Decide a committed study's claims again under the study protocol, from its archived runs (its
report.md "## Runs" table; the run directories are not committed), and say which verdicts changed.

    python -m lab.redecide lab/results/norms [more result folders ...]

For each folder: its study file lab/studies/<name>.yaml gives the grid (to read the run names),
the failure rule, the claims and the margins; runs made under the study protocol (a runs.json from a
study file with a protocol) keep its seeds' roles, older ones choose each arm's LR on the lowest 40%
of their seeds and test on the rest. Writes report.json (what the README and the index read) and the
report: decision.md beside the original report.md where the study was decided again before (or has
no runs.json), else report.md itself, rendered again with the figures the result and the val curves
draw (stability map, losses vs LR, trends, LR sensitivity) redrawn and the others (per-layer curves,
not archived) kept. Prints one line per claim: old verdict -> new."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from lab.archive import archived_runs, runs_file
from lab.figures import result_figures
from lab.record import as_json
from lab.report import render
from lab.result import compute_runs
from lab.studyfile import read_study_file
from training import errors
from training.rundir import read_json, write_text

REPO = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r"^\*\*(.+?)\*\*\n\n!\[.*?\]\((.+?\.png)\)", re.M)
NOTE_TABLE = (
    "Decided again from the archived runs of [report.md](report.md) (its Runs table: status, final "
    "and best loss and L0 per run; no curves, so no figures here), by the study file's failure "
    "rule: 'did not learn' reads each run's best eval exactly, the any-eval criteria its final "
    "eval only (a spike it recovered from cannot be seen). The runs predate the protocol: no "
    "bracketing, the lowest 40% of the seeds choose each arm's LR and the rest test it."
)
NOTE_JSON = (
    "Decided again from the archived runs of [report.md](report.md) (runs.json: every run's "
    "config, outcome and val curve; the figures are the report's), by the study file's failure "
    "rule and the current statistics."
)


def study_for(folder: Path) -> Path:
    """The study file of a result folder: lab/studies/<folder name>.yaml."""
    path = REPO / "lab" / "studies" / f"{folder.name}.yaml"
    if not path.is_file():
        raise ValueError(f"no study file lab/studies/{folder.name}.yaml")
    return path


def redecide(folder: Path) -> list[str]:
    path = study_for(folder)
    file = read_study_file(path)
    from_json = runs_file(folder) is not None
    if not from_json:
        file.protocol = (
            None  # the table-only archives were not made under it: split their seeds instead
        )
    res = compute_runs(archived_runs(folder, path), file)
    old_path = folder / "report.json"
    old = read_json(old_path) if old_path.exists() else {}
    metric = {"sensitivity": "lr50"}  # the claims that were about LR sensitivity are now about LR50
    before = {
        (c["paper"], c["A"], c["B"], metric.get(c["metric"], c["metric"])): c["agreement"]
        for c in old.get("claims", [])
    }
    if old.get("wall_min"):
        res.wall_s = old["wall_min"] * 60
    in_place = from_json and not (folder / "decision.md").is_file()
    # the live report, rendered again: its per-layer figures kept, the result's redrawn
    if in_place:
        kept = FIGURE.findall((folder / "report.md").read_text())
        drawn = dict(result_figures(res, folder))
        made = [(f, drawn.pop(f, c)) for c, f in kept] + list(drawn.items())
        write_text(folder / "report.md", render(res, made))
    else:
        note = NOTE_JSON if from_json else NOTE_TABLE
        text = render(res, []).replace("\n\n", f"\n\n{note}\n\n", 1)
        write_text(folder / "decision.md", text)
    new = as_json(res)
    new["about"] = old.get("about") or new["about"]
    new["wall_min"] = old.get("wall_min")
    new["decided_from"] = (
        "archived runs (runs.json), lab/redecide.py"
        if from_json
        else "archived runs (report.md), lab/redecide.py"
    )
    new["page"] = "report.md" if in_place else "decision.md"
    write_text(old_path, json.dumps(new, indent=1) + "\n")
    return [
        f"{folder.name}: {c['paper']}: {c['A']} vs {c['B']} ({c['metric']}): "
        f"{before.get((c['paper'], c['A'], c['B'], c['metric']), 'new claim')} -> {c['agreement']}"
        for c in new["claims"]
    ]


def main(argv: list[str] | None = None) -> int:
    """python -m lab.redecide; every error one line and its code (training/errors.py)."""
    return errors.run(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = errors.Parser(prog="python -m lab.redecide", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    a = p.parse_args(argv)
    for folder in a.folders:
        lines = redecide(folder)
        print("\n".join(lines) or f"{folder.name}: no claims")
    return 0


if __name__ == "__main__":
    sys.exit(main())
