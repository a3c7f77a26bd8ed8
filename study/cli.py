"""The study's two command lines, scripts/sweep.py and scripts/compare.py (their texts are the help)."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from data.sources import DataError
from study.grid import expand, expected_time, load_study, quick_study
from study.refine import refined_runs
from study.report import write_report
from study.runner import parse_shard, run_study, sbatch_script, shown, state
from training.config import ConfigError

SWEEP = """Run a study: expand a grid of config values into runs, train them in parallel workers, write a report.

    python scripts/sweep.py configs/study.yaml [--workers N] [--out studies] [--dry-run] [--no-report] [--quick]

A study file names a training config, overrides applied to every run, and a grid:

    name: norm-placement-lr          # the study directory: <out>/<name>/
    config: default.yaml             # training config, relative to this file
    overrides: {train: {steps: 500}} # applied to every run
    grid:                            # one run per combination; any config field (dotted), or the
      norm: [rmsnorm, layernorm]     # shorthands norm, placement, lr, seed
      lr: [1.0e-3, 1.0e-2]
      seed: [0, 1]
    threads_per_worker: 1            # CPU threads per run; workers = cores // threads (one per GPU on GPUs)
    claims:                          # what papers say, checked by the report ("What it shows")
      - {paper: Xiong et al. 2020, says: Post-LN needs warmup, a: {placement: post, optim.warmup_steps: 0},
         b: {placement: post, optim.warmup_steps: 100}, metric: loss, expect: higher}   # or lower | same
    quick: {config: tiny.yaml, grid: {...}}  # --quick: these replace the study's: a seconds-long smoke run

Runs live in <out>/<name>/runs/<run>/ (ordinary train.py run directories), their console output in
<out>/<name>/logs/<run>.log, and an index of every run's outcome in <out>/<name>/sweep.json. A rerun
skips finished runs and resumes interrupted or killed ones (every launch is train.py --resume); a diverged
run is a result and a failed run (a crash, bad input) is recorded with its one-line error, neither stops the
sweep. Ctrl-C or SIGTERM stops the runs in flight at a checkpoint and waits for them. At the end the report
(scripts/compare.py) is written.
"""

COMPARE = """Compare runs: read run directories (or study directories holding runs/) and write a stability report.

    python scripts/compare.py studies/norm-placement-lr [other run or study dirs...] [--out DIR]

Runs are grouped into arms by every config field that differs between them, except the learning rate
and the seed; the learning rate is the x axis and seeds give the spread. Writes report.md and PNG
figures into --out (default: the first directory). Reads only files; never a live process.

Per arm: best LR (the lowest mean over seeds of v = min(final val loss, L0), L0 the loss at initialization),
v there for every seed, the largest LR at which every seed finished `ok`, LR sensitivity (Wortsman et al.
2023: per seed, the mean over the LR grid of v(lr) - min v; then its mean and 95% CI over seeds), outcome
counts, spike scores (OLMo 2, parameters as the runs logged them) and tokens/s. Arms that differ in one field
are compared paired by seed (runs with one seed share init and batches): the mean difference, its 95% t CI,
a TOST verdict at the study's equivalence margin and the minimum detectable difference; runs that split into
separate outcomes are listed seed by seed, never averaged. The study file's claims are checked by the paired
verdict alone.
"""


def sweep(argv: list[str] | None = None) -> int:
    """scripts/sweep.py"""
    p = argparse.ArgumentParser(description=SWEEP.split("\n\n")[0], epilog=SWEEP.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", type=Path)
    p.add_argument("--out", type=Path, default=Path("studies"),
                   help="where studies go (default: studies/ in the current directory, like train.py's runs/)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--quick", action="store_true", help="run the study file's quick section (<name>-quick)")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run only every N-th run from the K-th (0 <= K < N), e.g. one task of a job array; no report")
    p.add_argument("--slurm", type=Path, default=None, metavar="FILE",
                   help="write an sbatch job-array script (one task per run, --shard) to FILE and exit")
    p.add_argument("--gpus-per-run", type=int, default=0, help="with --slurm: GPUs per array task")
    p.add_argument("--set", nargs="+", default=[], metavar="key=value",
                   help="extra config overrides for every run (e.g. data.source=text:corpus.txt)")
    a = p.parse_args(argv)
    try:
        study = load_study(a.study)
        study = quick_study(study) if a.quick else study
        runs = expand(study, a.set)
        shard = parse_shard(a.shard) if a.shard else None
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    study_dir = a.out.resolve() / study["name"]
    if a.slurm:
        a.slurm.write_text(sbatch_script(study, a.study, a.out.resolve(), len(runs), a.gpus_per_run,
                                         a.set + (["--quick"] if a.quick else [])))
        print(f"{a.slurm}: {len(runs)} array tasks; submit with: sbatch {a.slurm}")
        return 0
    if shard:
        return _sweep_shard(a, study, runs, study_dir, shard)
    if a.dry_run:
        for r in runs:
            print(r["name"], " ".join(r["overrides"]))
        print(f"{len(runs)} runs -> {study_dir}")
        if study.get("expected"):
            try:
                print(expected_time(study, runs))
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        return 0
    study_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(a.study, study_dir / "study.yaml")
    t0 = time.time()
    try:
        counts = run_study(study, runs, study_dir, a.workers)
        if counts is not None and study.get("refine"):  # stage 2: more seeds at each arm's best LR and neighbours
            lrs, more = refined_runs(study, runs, study_dir, a.set)
            print(f"refine: lr {', '.join(f'{x:g}' for x in lrs)} x seeds {study['refine']['seeds']}: "
                  f"{len(more)} more runs", file=sys.stderr)
            stage2 = run_study(study, runs + more, study_dir, a.workers)
            counts = None if stage2 is None else {k: counts.get(k, 0) + stage2.get(k, 0)
                                                  for k in {*counts, *stage2}}
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if counts is None:
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130
    print(f"sweep finished in {time.time() - t0:.0f}s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    if not a.no_report:
        print(f"report: {shown(write_report([study_dir], study_dir))}")
    return 0


def _sweep_shard(a, study: dict, runs: list[dict], study_dir: Path, shard: tuple[int, int]) -> int:
    """One task of a job array: this shard's grid runs; once every grid run of the study is finished (by all
    tasks), this shard's share of the second stage too. No report: compare.py reads the shared folder after."""
    k, n = shard
    study_dir.mkdir(parents=True, exist_ok=True)
    if not (study_dir / "study.yaml").exists():
        shutil.copy(a.study, study_dir / "study.yaml")
    index = f"sweep-{k}-of-{n}.json"
    try:
        counts = run_study(study, runs[k::n], study_dir, a.workers, index)
        if counts is not None and study.get("refine"):
            if all(state(study_dir / "runs" / r["name"]) == "finished" for r in runs):
                _, more = refined_runs(study, runs, study_dir, a.set)
                counts = run_study(study, more[k::n], study_dir, a.workers, index)
            else:
                print("refine: stage 2 waits until every grid run has finished; run this task again then",
                      file=sys.stderr)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if counts is None:
        return 130
    print(f"shard {k}/{n} finished; when every shard has: python scripts/compare.py {study_dir}", file=sys.stderr)
    return 0


def compare(argv: list[str] | None = None) -> int:
    """scripts/compare.py"""
    p = argparse.ArgumentParser(description=COMPARE.split("\n\n")[0], epilog=COMPARE.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, help="run directories or study directories")
    p.add_argument("--out", type=Path, default=None, help="where report.md and the figures go (default: first dir)")
    p.add_argument("--margin", type=float, default=None,
                   help="equivalence margin in nats (default: the study file's equivalence_margin, else 0.02)")
    a = p.parse_args(argv)
    missing = [d for d in a.dirs if not d.is_dir()]
    if missing:
        print(f"error: {missing[0]} is not a directory", file=sys.stderr)
        return 2
    try:
        path = write_report(a.dirs, a.out or a.dirs[0], a.margin)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {shown(path)}")
    return 0
