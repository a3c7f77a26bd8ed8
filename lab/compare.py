"""Compare runs: read run directories (or study directories holding runs/) and write a
stability report.

    python -m lab.compare studies/norm-placement-lr [other run or study dirs...] [--out DIR]

Runs are grouped into arms by every config field that differs between them, except the learning rate
and the seed. Writes report.md, report.json and PNG figures into --out (default: the first
directory if it is a study's, else studies/compare-<first run>). Reads only files; never a live
process. To look at runs rather than decide a study: python -m normlab.inspect.

Per arm: its failure curve P(fail | lr) (collapsed, unstable and diverged runs fail) and LR50 with a
95% CI; the best LR, chosen on the selection seeds; the final val loss there on the test seeds;
outcome counts, spike scores and tokens/s. Arms that differ in one field are compared by their LR50
ratio (95% CI) and by the loss difference at each one's best LR, paired by seed over the test seeds
where both runs trained (95% t CI, TOST at the study's margin, the minimum detectable difference).
The study file's claims are decided by one primary test each, Holm-adjusted within the study. Runs
without a protocol choose on the lowest 40% of their seeds and test on the rest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.report import write_report
from lab.runner import shown
from training import errors
from training.config import number


def compare(argv: list[str] | None = None) -> int:
    """python -m lab.compare; every error one line and its code (training/errors.py)."""
    return errors.run(_compare, argv)


def _compare(argv: list[str] | None) -> int:
    p = errors.Parser(
        prog="python -m lab.compare",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dirs", nargs="+", type=Path, help="run directories or study directories")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where report.md and the figures go (default: the first dir when it is a study "
        "directory; for run directories studies/compare-<first run>: never inside a run)",
    )
    p.add_argument(
        "--margin",
        type=number(float, "> 0"),
        default=None,
        help="equivalence margin in nats (default: the study file's equivalence_margin, else 0.02)",
    )
    p.add_argument("--no-figures", action="store_true", help="the text and JSON only (faster)")
    a = p.parse_args(argv)
    missing = [d for d in a.dirs if not d.is_dir()]
    if missing:
        raise errors.BadInput(f"{missing[0]} is not a folder of run directories")
    out = a.out or a.dirs[0]
    if a.out is None and (a.dirs[0] / "config.yaml").is_file():  # a run directory is the run's own
        out = Path("studies") / f"compare-{a.dirs[0].resolve().name}"
    if out.exists() and not out.is_dir():
        raise errors.BadInput(f"--out {out} is a file: give a folder for the report")
    # a full disk, a read-only folder: one line naming the path; every file the old or the new
    path = write_report(a.dirs, out, a.margin, draw=not a.no_figures)
    print(f"report: {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(compare(sys.argv[1:]))
