"""When do failed runs start to fail? For each run of a study that failed under its own rule, the
onset: the first step whose train loss is non-finite or `--jump` nats above the lowest train loss
so far. Per arm, how many onsets fall after each of `--after` steps: whether a control that needs a
history before it can act could have acted (OLMo-core's skip-step judges a step only once window / 2
= 64 losses are recorded; normlab's once max(20, window / 2): training/controls.py).

    python -m lab.analyses.failure_onset studies/critical-lr            # a study's output folder
    python -m lab.analyses.failure_onset studies/controls-2025 --jump 0.5 --after 20 64 100

Prints one markdown table, a row per arm with a failed run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from lab.read import find_runs, group_arms
from lab.studyfile import study_file
from training.config import number


def onset(records: list[dict], jump: float) -> int | None:
    """The first step whose train loss is non-finite or `jump` above its running minimum; None
    where there is none."""
    low = math.inf
    for r in records:
        v = r.get("train/loss")
        if v is None:
            continue
        if not math.isfinite(v) or v > low + jump:
            return r["step"]
        low = min(low, v)
    return None


def table(paths: list[Path], jump: float, after: list[int]) -> list[str]:
    """The markdown rows: arm, failed runs, runs with an onset, its median and 90th percentile,
    and for each of `after` how many onsets come later than that step."""
    runs = [r for r in find_runs(paths, study_file(paths).rule) if r.failed]
    if not runs:
        raise ValueError(f"no failed runs under {', '.join(map(str, paths))}")
    _, arms = group_arms(runs)
    head = " | ".join(f"onset > {a}" for a in after)
    out = [
        f"| arm | failed runs | with an onset ({jump:g} nats) | median onset | 90th percentile | "
        f"{head} |",
        "|---" * (5 + len(after)) + "|",
    ]
    for label, rs in arms.items():
        steps = sorted(s for r in rs if (s := onset(r.records, jump)) is not None)
        mid = f"{statistics.median(steps):g}" if steps else "-"
        p90 = f"{steps[min(len(steps) - 1, math.ceil(0.9 * len(steps)) - 1)]:g}" if steps else "-"
        later = " | ".join(str(sum(s > a for s in steps)) for a in after)
        out.append(f"| {label or 'all'} | {len(rs)} | {len(steps)} | {mid} | {p90} | {later} |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", type=Path, nargs="+", help="a study's output folder (or run dirs)")
    p.add_argument(
        "--jump", type=number(float, "> 0"), default=1.0, help="nats above the running minimum"
    )
    p.add_argument("--after", type=number(int, ">= 0"), nargs="+", default=[20, 64])
    a = p.parse_args(argv)
    missing = [str(x) for x in a.paths if not x.exists()]
    if missing:
        print(f"error: {', '.join(missing)}: no such folder", file=sys.stderr)
        return 2
    try:
        print("\n".join(table(a.paths, a.jump, a.after)))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
