"""Running a study's runs: workers sized to the machine, each a long-lived lab/worker.py process
that trains run after run (each run exactly `train.py ... --resume`, without paying for Python,
torch and the kernels again), the sweep.json index, skip / resume on a rerun, and a clean stop (its
runs checkpoint and are waited for) on Ctrl-C. `process_per_run` launches one train.py process per
run instead (the old way; bench/bench_study.py compares the two)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from lab.studyfile import Study
from training import errors
from training.config import load_config
from training.monitor import FINISHED
from training.rundir import RunDir, has_checkpoint, read_json, write_text

REPO = Path(__file__).resolve().parent.parent


def state(run_dir: Path) -> str:
    """'finished', 'resume' (a checkpoint to continue from) or 'new'."""
    run = RunDir(run_dir)
    if run.status() in FINISHED:
        return "finished"
    return "resume" if has_checkpoint(run.checkpoint) else "new"


# train.py processes alive (runs, workers): an interrupt stops and waits
_procs: set[subprocess.Popen] = set()


def worker_env(threads: int, gpu: str | None) -> dict:
    """A run's environment: its threads, its GPU, this checkout first on the path."""
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": path,
    }
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


class Worker:
    """One long-lived `python -m lab.worker` process: it trains the runs it is sent one after
    another. If it dies (a run's crash ends it on purpose; the OOM killer; a signal), the run it had
    gets that exit code and the next run starts a fresh process."""

    def __init__(self, threads: int, gpu: str | None, label: str = ""):
        # label: shown by ps
        self.env, self.proc, self.label = (worker_env(threads, gpu), None, label)

    def run(self, argv: list[str], log: Path) -> int:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lab.worker", self.label],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            _procs.add(self.proc)
        try:
            self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            answer = ""
        if answer:
            return json.loads(answer)["exit_code"]
        code = self.proc.wait()  # it died with the run
        _procs.discard(self.proc)
        return code if code != 0 else 1

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # end of requests: it exits
            self.proc.wait()
        if self.proc is not None:
            _procs.discard(self.proc)


def run_one(
    run: dict,
    study: Study,
    study_dir: Path,
    threads: int,
    gpu: str | None,
    worker: Worker | None = None,
) -> dict:
    """Train (or resume) one run, in `worker` or else in a process of its own; return its index
    entry. Every launch is the same command with --resume, which starts a run that has no checkpoint
    yet and continues one that has."""
    run_dir = study_dir / "runs" / run["name"]
    resumed = state(run_dir) == "resume"
    argv = run_argv(run, study, study_dir, threads)
    cmd = [sys.executable, str(REPO / "train.py"), *argv]
    log = study_dir / "logs" / f"{run['name']}.log"
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        if worker is not None:
            code = worker.run(argv, log)
        else:
            proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, env=worker_env(threads, gpu)
            )
            _procs.add(proc)
            try:
                code = proc.wait()
            finally:
                _procs.discard(proc)
    return run_entry(run, study, run_dir, code, time.time() - t0, resumed, log)


def run_argv(run: dict, study: Study, study_dir: Path, threads: int) -> list[str]:
    """train.py's arguments for one run of the study: every launch is the same command with
    --resume, which starts a run that has no checkpoint yet and continues one that has."""
    return [
        "--config",
        study.config,
        "--name",
        run["name"],
        "--resume",
        *run["overrides"],
        f"log.out_dir={study_dir / 'runs'}",
        f"train.threads={threads}",
    ]


def run_entry(
    run: dict, study: Study, run_dir: Path, code: int, wall_s: float, resumed: bool, log: Path
) -> dict:
    """A run's sweep.json entry once its process (or task) ended with `code`."""
    status = RunDir(run_dir).status() or "failed"
    if code not in (0, 3, 130):  # 3: diverged (a result), 130: interrupted (resumable)
        status = "failed"
    entry = {
        "name": run["name"],
        "overrides": run["overrides"],
        "status": status,
        "exit_code": code,
        "wall_time_s": round(wall_s, 1),
        "resumed": resumed,
        **({"design": study.design} if study.design else {}),
    }
    if status == "failed":
        errors = [line for line in log.read_text().splitlines() if line.startswith("error: ")]
        entry["error"] = (
            errors[-1] if errors else f"exit code {code}" + (" (killed)" if code < 0 else "")
        )
    return entry


def stop_runs(timeout: float = 120.0) -> None:
    """Ask every run in flight to stop (SIGTERM: each saves a checkpoint at its next step; an idle
    worker just ends) and wait for them, so that no run outlives the sweep; one that does not stop
    within the timeout is killed."""
    procs = list(_procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def workers_for(study: Study, requested: int | None) -> tuple[int, int, list[str | None]]:
    """(workers, threads per worker, gpu per worker slot)."""
    import torch

    threads = study.threads
    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # respect a restriction made by the caller
        ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        n = requested or len(ids)
        return n, threads, [ids[i % len(ids)] for i in range(n)]
    n = requested or study.workers or max(1, (os.cpu_count() or 1) // threads)
    return n, threads, [None] * n


def prepare_once(study: Study, runs: list[dict]) -> None:
    """Prepare the data and build the CPU kernels before the workers start, instead of in each of
    them (train.prepare)."""
    import train

    done = set()
    for cfg in (load_config(study.config, r["overrides"]) for r in runs):
        key = (tuple(sorted(vars(cfg.data).items())), cfg.model.norm_impl, cfg.model.ops_impl)
        if key not in done:
            done.add(key)
            train.prepare(cfg)


def _write_index(
    path: Path, study: Study, runs: list[dict], index: dict, running: dict | None = None
) -> None:
    """sweep.json: the runs' entries in their order, then those the file had of runs not asked
    for yet (a resumed sweep reaches a stage's runs later than a first one did); with a protocol,
    `running`: {budget ('all' without a budget axis): the first stage not finished}, {} when the
    sweep has finished (a report of the runs is interim until then)."""
    names = [r["name"] for r in runs]
    entries = [index[n] for n in dict.fromkeys(names + list(index)) if n in index]
    out = {"study": study.as_dict(), "runs": entries}
    if running is not None:
        out["running"] = _running(running)
    _write_json(path, out)


def _running(running: dict) -> dict:
    """{budget (None without a budget axis): stage} as sweep.json's `running` ('all', '300')."""
    return {("all" if b is None else f"{b:g}"): st for b, st in running.items()}


def _write_json(path: Path, obj: dict) -> None:
    """Write `path` whole or not at all (a .tmp beside it, then an atomic rename)."""
    write_text(path, json.dumps(obj, indent=2, default=dataclasses.asdict) + "\n")


def mark_finished(study_dir: Path, rest: dict | None = None) -> None:
    """Record in sweep.json that every stage of the study has run (or all but `rest`'s budgets:
    {budget: the first stage not run})."""
    path = study_dir / "sweep.json"
    if path.is_file():
        _write_json(path, {**read_json(path), "running": _running(rest or {})})


EXIT_STORAGE = errors.EXIT_STORAGE  # train.py's code for files that could not be written
EXIT_INTERRUPTED = errors.EXIT_INTERRUPTED


def _stop_at_once(signum, frame):
    """A second Ctrl-C while the runs stop: end now, in one line (the runs got it too: each stops
    at once, its last checkpoint intact; finished runs and sweep.json are whole files)."""
    kill = [p.kill() for p in _procs if p.poll() is None]  # noqa: F841  (any still in flight)
    print(
        "\ninterrupted again: stopped at once; finished runs are intact, rerun the same command to "
        "resume the others",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_INTERRUPTED)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N), 0 <= K < N: this process runs every N-th run starting at the K-th (a job
    array's task)."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be K/N with integers, e.g. 0/8, not {text!r}") from None
    if not 0 <= k < n:
        raise ValueError(
            f"--shard {text}: need 0 <= K < N (K counts from 0, like SLURM_ARRAY_TASK_ID)"
        )
    return k, n


SBATCH = (
    """#!/bin/bash
# A SLURM job array for study {name}: task i runs every {n}-th run from the i-th
# ({n} tasks, one run each). Submit it once for the grid; a study with a second stage (refine)
# needs it submitted again after the first array has finished: each task then runs its share of
# the stage-2 runs (finished runs are skipped).
# Afterwards: python -m lab.compare {out}
#SBATCH --job-name={name}
#SBATCH --array=0-{last}
#SBATCH --cpus-per-task={threads}
{gpu}#SBATCH --output={out}/logs/slurm-%A_%a.out
cd {repo}
"""
    + (  # the task's command, one line (the last)
        "{python} lab/sweep.py {study_file} --out {out_parent} --workers 1 "
        "--shard ${{SLURM_ARRAY_TASK_ID}}/{n}{extra}\n"
    )
)


def sbatch_script(
    study: Study,
    study_file: Path,
    out_parent: Path,
    n_runs: int,
    gpus_per_run: int,
    extra: list[str],
) -> str:
    """An sbatch job-array script: one array task per run, each a `sweep.py --shard i/N` on the
    shared folder."""
    return SBATCH.format(
        name=study.name,
        n=n_runs,
        last=n_runs - 1,
        threads=study.threads,
        gpu=f"#SBATCH --gpus-per-task={gpus_per_run}\n" if gpus_per_run else "",
        out=out_parent / study.name,
        repo=REPO,
        python=sys.executable,
        study_file=study_file.resolve(),
        out_parent=out_parent,
        extra=(" --set " + " ".join(extra)) if extra else "",
    )


def shown(path: Path) -> str:
    """A path as a user would type it: relative to the current directory where it lies below it,
    else absolute."""
    path = Path(path).absolute()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def finished_runs(study_dir: Path, runs: list[dict], todo: list[dict]) -> set[str]:
    """The study's finished runs: `runs` less `todo`, and every other finished folder in its runs/
    (a resumed sweep's protocol stage names only the runs it still wants, not earlier rounds')."""
    named = {r["name"] for r in runs}
    others = {d.name for d in (study_dir / "runs").iterdir()} - named
    done = {n for n in others if state(study_dir / "runs" / n) == "finished"}
    return done | (named - {r["name"] for r in todo})


def run_study(
    study: Study,
    runs: list[dict],
    study_dir: Path,
    workers: int | None = None,
    index_name: str = "sweep.json",
    process_per_run: bool = False,
    running: dict | None = None,
) -> dict[str, int] | None:
    """Run every unfinished run of the study on its workers, updating sweep.json as each ends; the
    outcome counts of this session, or None when interrupted (Ctrl-C / SIGTERM: the runs in flight
    checkpoint, are waited for, and a rerun resumes them)."""
    (study_dir / "logs").mkdir(parents=True, exist_ok=True)
    (study_dir / "runs").mkdir(exist_ok=True)
    n_workers, threads, gpus = workers_for(study, workers)
    # a shard of an array job writes its own (sweep-K-of-N.json)
    index_path = study_dir / index_name
    index = {e["name"]: e for e in read_json(index_path)["runs"]} if index_path.exists() else {}
    todo = [r for r in runs if state(study_dir / "runs" / r["name"]) != "finished"]
    done = finished_runs(study_dir, runs, todo)
    print(
        f"study {study.name}: {len(done) + len(todo)} runs, {len(done)} already finished, "
        f"{len(todo)} to run "
        f"on {n_workers} workers x {threads} threads -> {shown(study_dir)}"
    )
    prepare_once(study, runs)
    _write_index(index_path, study, runs, index, running)  # what is running, before any run ends
    free = list(range(n_workers))  # worker slots, for GPU assignment
    slots = [
        None if process_per_run else Worker(threads, gpus[i], str(study_dir / "runs"))
        for i in range(n_workers)
    ]
    counts: dict[str, int] = {}
    bar = tqdm(  # progress on stdout; a file or pipe gets the lines, not a bar
        total=len(done) + len(todo),
        initial=len(done),
        unit="run",
        desc=study.name,
        dynamic_ncols=True,
        file=sys.stdout,
        disable=not sys.stdout.isatty(),
    )
    pool = ThreadPoolExecutor(n_workers)
    # Ctrl-C and SIGTERM stop the sweep at a checkpoint; SIGINT's handler is installed here, not
    # inherited: a process started in the background by a shell script inherits SIGINT ignored, and
    # `kill -INT` did nothing
    previous = {
        sig: signal.signal(sig, handler)
        for sig, handler in (
            (signal.SIGTERM, _raise_interrupt),
            (signal.SIGINT, signal.default_int_handler),
        )
    }

    def job(run):
        slot = free.pop()
        try:
            return run_one(run, study, study_dir, threads, gpus[slot], slots[slot])
        finally:
            free.append(slot)

    try:
        for fut in as_completed([pool.submit(job, r) for r in todo]):
            entry = fut.result()
            index[entry["name"]] = entry
            counts[entry["status"]] = counts.get(entry["status"], 0) + 1
            bar.set_postfix_str(" ".join(f"{k} {v}" for k, v in sorted(counts.items())))
            bar.update(1)
            if entry["status"] == "failed":
                bar.write(
                    f"run {entry['name']} failed (exit {entry['exit_code']}): {entry['error']}",
                    file=sys.stderr,
                )
            _write_index(index_path, study, runs, index, running)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from a scheduler
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second one stops at once
            signal.signal(sig, _stop_at_once)
        pool.shutdown(wait=False, cancel_futures=True)
        stop_runs()  # runs checkpoint and exit; a rerun resumes them
        pool.shutdown(wait=True)
        bar.close()
        return None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for worker in slots:
            if worker is not None:
                worker.close()
    pool.shutdown()
    bar.close()
    _write_index(index_path, study, runs, index, running)
    return counts
