"""run: past one machine, each stage's runs as one submitit job array (SLURM, or submitit's local
executor, the same path on one machine: what the tests use), collected as they finish; the sweep
plans the next stage from them and goes on to the report. A preempted or timed-out task is requeued
by submitit (RunTask is Checkpointable) and its run resumes from its checkpoint: every launch is
train.py --resume. An interrupted sweep resumes from the runs on the shared folder, as the pool's
does."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import submitit

from lab.runner import REPO, _write_index, prepare_once, run_argv, run_entry, shown, state
from lab.studyfile import Study
from training.rundir import read_json


class RunTask(submitit.helpers.Checkpointable):
    """One run, called in the job's process: train.main(argv) with its output in the run's log.
    Checkpointable: on preemption or timeout submitit calls its checkpoint() and requeues the same
    task, whose run resumes from its checkpoint."""

    def __init__(self, argv: list[str], log: str, threads: int):
        self.argv, self.log, self.threads = argv, log, threads

    def __call__(self) -> int:
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[key] = str(self.threads)
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        import train

        with open(self.log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            f.write(f"$ train.py {' '.join(self.argv)}\n")
            f.flush()
            return train.main(self.argv)  # a SystemExit (submitit's requeue) goes on up


def executor(kind: str, folder: Path, study: Study, options: dict):
    """A submitit executor of `kind` (local | slurm) writing its files in `folder`; options:
    partition, time_min, cpus_per_run, gpus_per_run, array_parallelism (from the flags, else the
    study file's `slurm:`)."""
    time_min = int(options.get("time_min") or 60)
    cpus = int(options.get("cpus_per_run") or study.threads_per_worker or 1)
    if kind == "local":
        ex = submitit.LocalExecutor(folder, max_num_timeout=3)
        ex.update_parameters(timeout_min=time_min, cpus_per_task=cpus)
        return ex
    ex = submitit.SlurmExecutor(folder, max_num_timeout=3)
    params = {
        "job_name": study.name,
        "time": time_min,
        "cpus_per_task": cpus,
        "setup": [f"export PYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}}"],
    }
    if options.get("partition"):
        params["partition"] = options["partition"]
    if options.get("gpus_per_run"):
        params["gpus_per_node"] = int(options["gpus_per_run"])
    if options.get("array_parallelism"):
        params["array_parallelism"] = int(options["array_parallelism"])
    ex.update_parameters(**params)
    return ex


def run_stage(
    study: Study,
    runs: list[dict],
    study_dir: Path,
    ex,
    index_name: str = "sweep.json",
    running: dict | None = None,
) -> dict[str, int] | None:
    """Submit every unfinished run of `runs` as one job array and collect them as they finish,
    updating sweep.json: the outcome counts, or None when interrupted (the tasks are left to finish
    or be requeued; a rerun passes over the runs they finished)."""
    (study_dir / "logs").mkdir(parents=True, exist_ok=True)
    (study_dir / "runs").mkdir(exist_ok=True)
    index_path = study_dir / index_name
    index = {e["name"]: e for e in read_json(index_path)["runs"]} if index_path.exists() else {}
    todo = [r for r in runs if state(study_dir / "runs" / r["name"]) != "finished"]
    threads = study.threads
    print(
        f"study {study.name}: {len(runs)} runs, {len(runs) - len(todo)} already finished, "
        f"{len(todo)} submitted as one job array -> {shown(study_dir)}"
    )
    prepare_once(study, runs)
    _write_index(index_path, study, runs, index, running)
    if not todo:
        return {}
    tasks, t0 = [], time.time()
    for r in todo:
        log = study_dir / "logs" / f"{r['name']}.log"
        resumed = state(study_dir / "runs" / r["name"]) == "resume"
        tasks.append(
            (r, log, resumed, RunTask(run_argv(r, study, study_dir, threads), str(log), threads))
        )
    jobs = ex.submit_array([t for *_, t in tasks])
    counts: dict[str, int] = {}
    pending = list(zip(tasks, jobs, strict=True))
    try:
        while pending:
            for item in [p for p in pending if p[1].done()]:
                (r, log, resumed, _), job = item
                pending.remove(item)
                try:
                    code = job.result()
                except Exception as e:  # the task failed outside train.main (submitit says why)
                    code = 1
                    with open(log, "a") as f:
                        f.write(f"error: the job failed: {str(e).strip().splitlines()[-1]}\n")
                entry = run_entry(r, study, study_dir / "runs" / r["name"], code,
                                  time.time() - t0, resumed, log)  # fmt: skip
                index[entry["name"]] = entry
                counts[entry["status"]] = counts.get(entry["status"], 0) + 1
                if entry["status"] == "failed":
                    print(f"run {entry['name']} failed: {entry.get('error')}", file=sys.stderr)
                _write_index(index_path, study, runs, index, running)
            if pending:
                time.sleep(1.0)
    except KeyboardInterrupt:
        print(
            f"interrupted: {len(pending)} tasks of the array go on (or are requeued); rerun the "
            "same command to collect them",
            file=sys.stderr,
        )
        return None
    return counts
