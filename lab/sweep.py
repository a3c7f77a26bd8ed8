"""Run a study: expand a grid of config values into runs, train them in parallel workers,
write a report.

    python -m lab.sweep lab/studies/norm-placement-lr.yaml [--workers N] [--out studies]
        [--dry-run] [--no-report] [--quick]

A study file names a training config, overrides applied to every run, a grid and (for a study that
decides claims) the protocol that picks the runs after the grid:

    name: norm-placement-lr          # = the file's name; the study directory: <out>/<name>/
    about: "Is RMSNorm more, ..."    # the question, one sentence (reports, the results index)
    config: default.yaml             # training config: beside this file, else in configs/train/
    overrides: {train: {steps: 500}} # applied to every run
    grid:                            # one run per combination; any config field (dotted), or the
      norm: [rmsnorm, layernorm]     # shorthands norm, placement, lr, seed (no seed: protocol)
      lr: [1.0e-3, 1.0e-2]
    protocol:                        # grid on the selection seeds, then per arm: bracket the best
      selection_seeds: [0, 1]        # LR and the failure edge, refine next to both, failure seeds
      test_seeds: [2, 3, 4]          # across the edge, test seeds at the best LR (chosen on the
      bracket: {factor: 3.16, min_lr: 1.0e-5, max_lr: 10, steps: 3}   # selection seeds only)
      refine: 2
    equivalence_margin: 0.02         # nats, with margin_reason: why this margin
    threads_per_worker: 1            # CPU threads per run; workers = cores // threads
    claims:                          # what papers say, checked by the report ("What it shows")
      - {paper: Xiong et al. 2020, says: Post-LN is less stable than Pre-LN, a: {placement: post},
         b: {placement: pre}, metric: lr50, expect: lower}   # metric: best_loss | lr50 | ...
    quick: {config: tiny.yaml, grid: {...}}  # --quick: these replace the study's (a smoke run)

Runs live in <out>/<name>/runs/<run>/ (ordinary train.py run directories), their console output in
<out>/<name>/logs/<run>.log, and an index of every run's outcome in <out>/<name>/sweep.json. A rerun
skips finished runs and resumes interrupted or killed ones (every launch is train.py --resume), and
the protocol makes the same choices from the same finished runs; a diverged run is a result and a
failed run (a crash, bad input) is recorded with its one-line error, neither stops the sweep. Ctrl-C
or SIGTERM stops the runs in flight at a checkpoint and waits for them. At the end the report
(lab/compare.py) is written.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lab.design import pin
from lab.protocol import budget_of, budgets, first_runs, next_stage
from lab.report import write_report
from lab.runner import (
    mark_finished,
    parse_shard,
    run_study,
    sbatch_script,
    shown,
    state,
)
from lab.studyfile import Study, expected_time, load_study, quick_study
from training import errors
from training.config import number
from training.rundir import write_text

EXECUTORS = ("pool", "local", "slurm")  # --executor: pool here; local, slurm lab/submit.py


def sweep(argv: list[str] | None = None) -> int:
    """python -m lab.sweep; every error one line and its code (training/errors.py): a bad study
    file or design 2, a full disk 4 naming the path, every file whole."""
    return errors.run(_sweep, argv)


def _sweep(argv: list[str] | None) -> int:
    p = errors.Parser(
        prog="python -m lab.sweep",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("study", type=Path)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("studies"),
        help="where studies go (default: studies/ in the current directory, like train.py's runs/)",
    )
    p.add_argument(
        "--workers",
        type=number(int, ">= 1"),
        default=None,
        help="parallel runs, >= 1 (default: the study file's workers, else one per "
        "threads_per_worker cores, one per GPU)",
    )
    p.add_argument(
        "--process-per-run",
        action="store_true",
        help="launch one train.py process per run instead of long-lived workers "
        "(slower; the same numbers)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    p.add_argument("--no-report", action="store_true")
    p.add_argument(
        "--quick", action="store_true", help="run the study file's quick section (<name>-quick)"
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="run only every N-th run from the K-th (0 <= K < N), e.g. one task of a job array; "
        "no report",
    )
    p.add_argument(
        "--slurm",
        type=Path,
        default=None,
        metavar="FILE",
        help="write an sbatch job-array script (one task per run, --shard) to FILE and exit",
    )
    p.add_argument(
        "--gpus-per-run",
        type=number(int, ">= 0"),
        default=None,
        help="with --executor slurm (or --slurm): GPUs per run (default: the study file's slurm:)",
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="pool",
        help="pool: this machine's workers (default); slurm: each stage's runs as one submitit job "
        "array (preempted or timed-out runs requeued and resumed); local: submitit's local "
        "executor, the same path on this machine",
    )
    p.add_argument("--partition", default=None, help="--executor slurm: the SLURM partition")
    p.add_argument(
        "--time", type=number(int, ">= 1"), default=None, help="minutes a run may take (a task)"
    )
    p.add_argument("--cpus-per-run", type=number(int, ">= 1"), default=None)
    p.add_argument(
        "--array-parallelism",
        type=number(int, ">= 1"),
        default=None,
        help="--executor slurm: at most this many of an array's tasks at once",
    )
    p.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="key=value",
        help="extra config overrides for every run (e.g. data.source=text:corpus.txt)",
    )
    p.add_argument(
        "--up-to",
        type=number(int, ">= 1"),
        default=None,
        metavar="STEPS",
        help="along a budget axis (train.steps), run only the budgets up to STEPS (every stage "
        "of each); a later sweep without it goes on to the rest",
    )
    a = p.parse_args(argv)
    raw = load_study(a.study)  # the design: the file as study.yaml keeps it (lab/design.py)
    study = quick_study(raw) if a.quick else raw
    runs = first_runs(study, a.set)
    shard = parse_shard(a.shard) if a.shard else None
    if a.out.exists() and not a.out.is_dir():
        raise errors.BadInput(f"--out {a.out} is a file: give the folder studies go in")
    flags = {
        "partition": a.partition,
        "time_min": a.time,
        "cpus_per_run": a.cpus_per_run,
        "gpus_per_run": a.gpus_per_run,
        "array_parallelism": a.array_parallelism,
    }  # the flags, over the study file's slurm:
    a.options = {**(raw.slurm or {}), **{k: v for k, v in flags.items() if v is not None}}
    study_dir = a.out.resolve() / study.name
    if a.slurm:
        extra = a.set + (["--quick"] if a.quick else [])
        gpus = int(a.options.get("gpus_per_run") or 0)
        script = sbatch_script(study, a.study, a.out.resolve(), len(runs), gpus, extra)
        write_text(a.slurm, script)
        print(f"{a.slurm}: {len(runs)} array tasks; submit with: sbatch {a.slurm}")
        return 0
    if shard:
        return _sweep_shard(a, study, runs, study_dir, shard)
    if a.dry_run:
        for r in runs:
            print(r["name"], " ".join(r["overrides"]))
        print(f"{len(runs)} runs -> {study_dir}")
        if study.protocol:
            print(
                "then the protocol's stages (bracket, refine, edge, critical, test) add runs "
                "chosen from their results"
            )
        if study.expected:
            print(expected_time(study, runs))
        return 0
    study_dir.mkdir(parents=True, exist_ok=True)
    # the design its runs are made under; a changed file needs a history note
    study.design = pin(study_dir, raw, str(a.study), a.set)
    write_text(study_dir / "study.yaml", a.study.read_text())
    t0 = time.time()
    a.ex = None
    if a.executor != "pool":  # submitit: its files beside the study's runs, on the shared folder
        from lab.submit import executor

        a.ex = executor(a.executor, study_dir / "submitit", study, a.options)
    counts = (  # a bad data source (train.prepare) is a ConfigError: one line, exit 2
        _run_stages(a, study, study_dir) if study.protocol else _run(a, study, runs, study_dir)
    )
    if counts is None:
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130
    print(
        f"sweep finished in {time.time() - t0:.0f}s: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    if not a.no_report:
        print(f"report: {shown(write_report([study_dir], study_dir))}")
    return 0


def _run_stages(a, study: Study, study_dir: Path) -> dict[str, int] | None:
    """The protocol's stages in order (budget by budget, shortest first), each chosen from the
    finished runs: the outcome counts, or None when interrupted."""
    made: list[dict] = []
    counts: dict[str, int] = {}
    while (stage := next_stage(study, study_dir, made, a.set, a.up_to)) is not None:
        name, more = stage
        made = made + more
        if all(state(study_dir / "runs" / r["name"]) == "finished" for r in more):
            continue  # a resumed sweep passes over the stages it finished
        budget = budget_of(more[0])
        later = [b for b in budgets(study) if b is not None and budget is not None and b > budget]
        running = {budget: name, **{b: "grid" for b in later}}
        print(
            f"{name}{'' if budget is None else f' at {budget:g} steps'}: {len(more)} more runs "
            f"({', '.join(sorted({_lr_of(r) for r in more}, key=float))})"
        )
        more_counts = _run(a, study, made, study_dir, running)
        if more_counts is None:
            return None
        counts = {k: counts.get(k, 0) + more_counts.get(k, 0) for k in {*counts, *more_counts}}
    rest = [b for b in budgets(study) if None not in (a.up_to, b) and b > a.up_to]
    if rest:
        print(f"stopped before the budgets above {a.up_to} steps: rerun without --up-to for them")
        mark_finished(study_dir, {b: "grid" for b in rest})
    else:
        mark_finished(study_dir)
    return counts


def _run(a, study: Study, runs: list[dict], study_dir: Path, running: dict | None = None):
    """The unfinished runs of `runs`: on this machine's workers, or as one submitit job array."""
    if a.ex is not None:
        from lab.submit import run_stage

        return run_stage(study, runs, study_dir, a.ex, running=running)
    return run_study(
        study, runs, study_dir, a.workers, process_per_run=a.process_per_run, running=running
    )


def _lr_of(run: dict) -> str:
    return next(o.split("=", 1)[1] for o in reversed(run["overrides"]) if o.startswith("optim.lr="))


def _sweep_shard(a, study: Study, runs: list[dict], study_dir: Path, shard: tuple[int, int]) -> int:
    """One task of a job array: this shard's grid runs; once every grid run of the study is finished
    (by all tasks), this shard's share of the second stage too. No report: compare.py reads the
    shared folder after."""
    k, n = shard
    study_dir.mkdir(parents=True, exist_ok=True)
    # a ConfigError: sweep() says it
    study.design = pin(study_dir, load_study(a.study), str(a.study), a.set)
    if not (study_dir / "study.yaml").exists():
        write_text(study_dir / "study.yaml", a.study.read_text())
    index = f"sweep-{k}-of-{n}.json"
    counts = run_study(study, runs[k::n], study_dir, a.workers, index, a.process_per_run)
    while counts is not None and study.protocol:
        if not all(state(study_dir / "runs" / r["name"]) == "finished" for r in runs):
            print(
                "the protocol's next stage waits until every run so far has finished; run this "
                "task again then"
            )
            break
        stage = next_stage(study, study_dir, runs, a.set)
        if stage is None:
            break
        runs = runs + stage[1]
        counts = run_study(study, stage[1][k::n], study_dir, a.workers, index, a.process_per_run)
    if counts is None:
        return 130
    print(f"shard {k}/{n} finished; when every shard has: python -m lab.compare {study_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(sweep(sys.argv[1:]))
