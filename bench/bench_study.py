"""A study's throughput: where a run's wall time goes, and runs per hour with one train.py process
per run (the old runner) vs persistent workers (lab/worker.py, the runner's default).

    python -m bench.bench_study [--study lab/studies/norm-placement-lr.yaml] [--runs 4]
        [--rounds 3] [--workers 2] [--where model.dim=256] [--save bench/results/study.md]
        [--set key=value ...]

The runs are the study's first grid runs (--where keeps those whose overrides contain every given
key=value, e.g. the width study's largest model), the same runs in both modes, each round in a fresh
folder, run through lab/runner.run_study on --workers workers as a study runs them. Rounds
alternate the order of the two modes (A B, B A, ...) so that machine noise hits both alike. Per run,
from the files a run writes anyway: its optimizer steps (each step's train/tokens_per_s in
metrics.jsonl is the step's tokens over its seconds), the rest of the run (summary.json's
wall_time_s less the steps: data, model, evals, checkpoints, logging), and "start-up and exit", the
rest of its wall time from launch to the end of its answer (sweep.json): the interpreter, imports,
configuration, leaving. Prints the breakdown per mode and the runs-per-hour ratio (persistent /
process per run) per round, median and min..max."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.benchlib import SavedOutput
from lab.protocol import first_runs
from lab.runner import run_study
from lab.studyfile import Study, load_study
from training.config import load_config, number
from training.rundir import RunDir

MODES = {
    "process per run": True,
    "persistent workers": False,
}  # name -> run_study's process_per_run
PHASES = ("start-up and exit", "steps", "the rest of the run (data, model, evals, checkpoints)")


def one_round(
    study: Study, runs: list[dict], folder: Path, workers: int, process_per_run: bool
) -> tuple[float, list]:
    """(seconds for all runs, per-run phase seconds)."""
    t0 = time.perf_counter()
    counts = run_study(study, runs, folder, workers, process_per_run=process_per_run)
    elapsed = time.perf_counter() - t0
    if counts is None or set(counts) - {"ok", "plateau", "collapsed", "unstable", "diverged"}:
        raise SystemExit(f"error: a run failed to run ({counts}); see {folder / 'logs'}")
    phases = []
    for entry in json.loads((folder / "sweep.json").read_text())["runs"]:
        run = RunDir(folder / "runs" / entry["name"])
        summary, tc = run.read_summary(), load_config(run.config).train
        steps = sum(
            tc.batch_size * tc.seq_len / r["train/tokens_per_s"]
            for r in run.records()
            if r.get("train/tokens_per_s")
        )
        phases.append(
            {
                PHASES[0]: entry["wall_time_s"] - summary["wall_time_s"],
                PHASES[1]: steps,
                PHASES[2]: summary["wall_time_s"] - steps,
            }
        )
    return elapsed, phases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, default=Path("lab/studies/norm-placement-lr.yaml"))
    p.add_argument("--runs", type=number(int, ">= 1"), default=6, help="runs per mode and round")
    p.add_argument("--rounds", type=number(int, ">= 1"), default=3)
    p.add_argument("--workers", type=number(int, ">= 1"), default=2)
    p.add_argument(
        "--where",
        nargs="*",
        default=[],
        metavar="key=value",
        help="keep the grid runs whose overrides contain all of these",
    )
    p.add_argument(
        "--save", type=Path, default=None, help="also write the printed tables to this file"
    )
    p.add_argument(
        "--set", nargs="*", default=[], metavar="key=value", help="config overrides for every run"
    )
    a = p.parse_args(argv)
    study = load_study(a.study)
    runs = [r for r in first_runs(study, a.set) if all(w in r["overrides"] for w in a.where)][
        : a.runs
    ]
    if len(runs) < a.runs:
        print(
            f"error: the study has {len(runs)} grid runs matching {a.where}, fewer than "
            f"--runs {a.runs}",
            file=sys.stderr,
        )
        return 2
    command = "python -m bench.bench_study " + " ".join(argv if argv is not None else sys.argv[1:])
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    phases: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp, SavedOutput(a.save, command):
        print(
            f"## Study throughput: {study.name}, {len(runs)} runs per mode and round, "
            f"{a.workers} workers\n"
        )
        print(
            "Runs: "
            + "; ".join(" ".join(r["overrides"]) for r in runs[:2])
            + (" ..." if len(runs) > 2 else "")
        )
        for r in range(a.rounds):
            order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
            for mode in order:
                elapsed, ph = one_round(
                    study,
                    runs,
                    Path(tmp) / f"r{r}-{'ppr' if MODES[mode] else 'pw'}",
                    a.workers,
                    MODES[mode],
                )
                seconds[mode].append(elapsed)
                phases[mode].extend(ph)
                print(f"round {r + 1}, {mode}: {elapsed:.1f} s", file=sys.stderr)
        print(
            "\n### Where a run's wall time goes (seconds per run, mean over every run of every "
            "round)\n"
        )
        print("| phase | " + " | ".join(MODES) + " |")
        print("|---|" + "---|" * len(MODES))
        for phase in PHASES:
            cells = [statistics.mean(ph.get(phase, 0.0) for ph in phases[m]) for m in MODES]
            print(f"| {phase} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
        totals = [statistics.mean(sum(ph.values()) for ph in phases[m]) for m in MODES]
        print("| **total** | " + " | ".join(f"**{t:.2f}**" for t in totals) + " |")
        per_hour = {m: [len(runs) * 3600 / s for s in seconds[m]] for m in MODES}
        ratios = [
            b / a_
            for a_, b in zip(
                per_hour["process per run"], per_hour["persistent workers"], strict=True
            )
        ]
        print("\n### Runs per hour (each round: the same runs in both modes, side by side)\n")
        print("| round | process per run | persistent workers | ratio |")
        print("|---|---|---|---|")
        for r, (x, y, q) in enumerate(
            zip(per_hour["process per run"], per_hour["persistent workers"], ratios, strict=True)
        ):
            print(f"| {r + 1} | {x:.0f} | {y:.0f} | {q:.2f}x |")
        print(
            f"\nPersistent workers / process per run: **{statistics.median(ratios):.2f}x** runs "
            f"per hour (median "
            f"of {len(ratios)} rounds, {min(ratios):.2f}..{max(ratios):.2f})."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
