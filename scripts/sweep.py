"""Run a study: expand a grid of config values into runs, train them in parallel workers, write a report.

    python scripts/sweep.py configs/study.yaml [--workers N] [--out studies] [--dry-run] [--no-report]

A study file names a training config, overrides applied to every run, and a grid:

    name: norm-placement-lr          # the study directory: <out>/<name>/
    config: default.yaml             # training config, relative to this file
    overrides: {train: {steps: 500}} # applied to every run
    grid:                            # one run per combination; any config field (dotted), or the
      norm: [rmsnorm, layernorm]     # shorthands norm, placement, lr, seed
      lr: [1.0e-3, 1.0e-2]
      seed: [0, 1]
    threads_per_worker: 1            # CPU threads per run; workers = cores // threads (one per GPU on GPUs)

Runs live in <out>/<name>/runs/<run>/ (ordinary train.py run directories), their console output in
<out>/<name>/logs/<run>.log, and an index of every run's outcome in <out>/<name>/sweep.json. A rerun
skips finished runs and resumes interrupted or killed ones (every launch is train.py --resume); a diverged
run is a result and a failed run (a crash, bad input) is recorded with its one-line error, neither stops the
sweep. Ctrl-C or SIGTERM stops the runs in flight at a checkpoint and waits for them. At the end
scripts/compare.py writes report.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omegaconf import OmegaConf  # noqa: E402
from tqdm import tqdm  # noqa: E402

from data.sources import DataError  # noqa: E402
from training.checkpoint import has_checkpoint  # noqa: E402
from training.config import ConfigError, load_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ALIASES = {"norm": "model.norm", "placement": "model.placement", "lr": "optim.lr", "seed": "train.seed",
           "seeds": "train.seed"}
FINISHED = ("ok", "plateau", "diverged")  # results: never rerun
STUDY_KEYS = {"name", "config", "overrides", "grid", "threads_per_worker", "workers"}


def load_study(path: Path) -> dict:
    """The study file as a dict, with the grid's keys resolved to dotted config fields."""
    if not path.is_file():
        raise ConfigError(f"study file {str(path)!r} does not exist")
    try:
        study = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:
        raise ConfigError(f"cannot parse {str(path)!r}: {str(e).strip().splitlines()[0]}") from None
    if not isinstance(study, dict) or not isinstance(study.get("grid"), dict):
        raise ConfigError(f"{path}: a study is a mapping with a 'grid' mapping of config fields to value lists")
    unknown = set(study) - STUDY_KEYS
    if unknown:
        raise ConfigError(f"unknown study key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(STUDY_KEYS))}")
    if not study.get("grid"):
        raise ConfigError(f"{path}: a study needs a non-empty 'grid'")
    grid = {}
    for key, values in study["grid"].items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key} must be a non-empty list of values")
        grid[ALIASES.get(key, key)] = values
    study["grid"] = grid
    for key in ("threads_per_worker", "workers"):
        value = study.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{path}: {key} must be an integer >= 1, got {value!r}")
    study["name"] = study.get("name") or path.stem
    study["config"] = str((path.parent / study.get("config", "default.yaml")).resolve())
    return study


def flatten(d: dict, prefix: str = "") -> list[str]:
    """{'train': {'steps': 5}} -> ['train.steps=5']."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += flatten(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={'null' if v is None else v}")
    return out


def _slug(key: str, value) -> str:
    short = {"model.norm": "", "model.placement": "", "optim.lr": "lr", "train.seed": "s"}
    return f"{short.get(key, key.rsplit('.', 1)[-1])}{value}"


def expand(study: dict, extra: list[str] = ()) -> list[dict]:
    """One {'name', 'overrides'} per grid combination, in grid order; every config validated up front."""
    base = flatten(study.get("overrides") or {}) + list(extra)
    runs = []
    keys = list(study["grid"])
    for values in itertools.product(*study["grid"].values()):
        name = "-".join(_slug(k, v) for k, v in zip(keys, values, strict=True))
        overrides = base + [f"{k}={v}" for k, v in zip(keys, values, strict=True)]
        load_config(study["config"], overrides)  # raises ConfigError on a bad value
        runs.append({"name": name, "overrides": overrides})
    return runs


def state(run_dir: Path) -> str:
    """'finished', 'resume' (a checkpoint to continue from) or 'new'."""
    try:
        if json.loads((run_dir / "summary.json").read_text())["status"] in FINISHED:
            return "finished"
    except (OSError, ValueError, KeyError):
        pass
    return "resume" if has_checkpoint(run_dir / "checkpoints" / "latest.pt") else "new"


_procs: set[subprocess.Popen] = set()  # the train.py runs in flight, so an interrupt can stop and wait for them


def run_one(run: dict, study: dict, study_dir: Path, threads: int, gpu: str | None) -> dict:
    """Train (or resume) one run in a subprocess; return its index entry. Every launch is the same command with
    --resume, which starts a run that has no checkpoint yet and continues one that has."""
    runs_dir, run_dir = study_dir / "runs", study_dir / "runs" / run["name"]
    resumed = state(run_dir) == "resume"
    cmd = [sys.executable, str(REPO / "train.py"), "--config", study["config"], "--name", run["name"], "--resume",
           *run["overrides"], f"log.out_dir={runs_dir}", f"train.threads={threads}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    log = study_dir / "logs" / f"{run['name']}.log"
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)  # same cwd as us
        _procs.add(proc)
        try:
            code = proc.wait()
        finally:
            _procs.discard(proc)
    try:
        status = json.loads((run_dir / "summary.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        status = "failed"
    if code not in (0, 3, 130):  # 3: diverged (a result), 130: interrupted (resumable)
        status = "failed"
    entry = {"name": run["name"], "overrides": run["overrides"], "status": status, "exit_code": code,
             "wall_time_s": round(time.time() - t0, 1), "resumed": resumed}
    if status == "failed":
        errors = [line for line in log.read_text().splitlines() if line.startswith("error: ")]
        entry["error"] = errors[-1] if errors else f"exit code {code}" + (" (killed)" if code < 0 else "")
    return entry


def stop_runs(timeout: float = 120.0) -> None:
    """Ask every run in flight to stop (SIGTERM: each saves a checkpoint at its next step) and wait for them, so
    that no run outlives the sweep; one that does not stop within the timeout is killed."""
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


def workers_for(study: dict, requested: int | None) -> tuple[int, int, list[str | None]]:
    """(workers, threads per worker, gpu per worker slot)."""
    import torch

    threads = int(study.get("threads_per_worker", 1))
    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # respect a restriction made by the caller
        ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        n = requested or len(ids)
        return n, threads, [ids[i % len(ids)] for i in range(n)]
    n = requested or study.get("workers") or max(1, (os.cpu_count() or 1) // threads)
    return n, threads, [None] * n


def prepare_once(study: dict, runs: list[dict]) -> None:
    """Prepare the data and build the CPU kernels before the workers start, instead of in each of them."""
    from data.prepare import prepare

    cfgs = [load_config(study["config"], r["overrides"]) for r in runs]
    for data in {tuple(sorted(vars(c.data).items())) for c in cfgs}:
        prepare(**dict(data))
    if any("fast" in (c.model.norm_impl, c.model.ops_impl) for c in cfgs):
        from kernels import kernel_available

        kernel_available()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "studies")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--set", nargs="+", default=[], metavar="key=value",
                   help="extra config overrides for every run (e.g. data.source=text:corpus.txt)")
    a = p.parse_args(argv)
    try:
        study = load_study(a.study)
        runs = expand(study, a.set)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    study_dir = a.out.resolve() / study["name"]
    if a.dry_run:
        for r in runs:
            print(r["name"], " ".join(r["overrides"]))
        print(f"{len(runs)} runs -> {study_dir}")
        return 0
    (study_dir / "logs").mkdir(parents=True, exist_ok=True)
    (study_dir / "runs").mkdir(exist_ok=True)
    shutil.copy(a.study, study_dir / "study.yaml")
    n_workers, threads, gpus = workers_for(study, a.workers)
    index_path = study_dir / "sweep.json"
    index = {e["name"]: e for e in json.loads(index_path.read_text())["runs"]} if index_path.exists() else {}
    todo = [r for r in runs if state(study_dir / "runs" / r["name"]) != "finished"]
    print(f"study {study['name']}: {len(runs)} runs, {len(runs) - len(todo)} already finished, {len(todo)} to run "
          f"on {n_workers} workers x {threads} threads -> {study_dir}", file=sys.stderr)
    try:
        prepare_once(study, runs)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.time()
    free = list(range(n_workers))  # worker slots, for GPU assignment
    counts = {}
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), unit="run", desc=study["name"], dynamic_ncols=True)
    pool = ThreadPoolExecutor(n_workers)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        def job(run):
            slot = free.pop()
            try:
                return run_one(run, study, study_dir, threads, gpus[slot])
            finally:
                free.append(slot)

        futures = [pool.submit(job, r) for r in todo]
        for fut in as_completed(futures):
            entry = fut.result()
            index[entry["name"]] = entry
            counts[entry["status"]] = counts.get(entry["status"], 0) + 1
            bar.set_postfix_str(" ".join(f"{k} {v}" for k, v in sorted(counts.items())))
            bar.update(1)
            if entry["status"] == "failed":
                bar.write(f"run {entry['name']} failed (exit {entry['exit_code']}): {entry['error']}")
            _write_index(index_path, study, runs, index)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from a scheduler
        pool.shutdown(wait=False, cancel_futures=True)
        stop_runs()  # runs checkpoint and exit; a rerun resumes them
        pool.shutdown(wait=True)
        bar.close()
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    pool.shutdown()
    bar.close()
    _write_index(index_path, study, runs, index)
    print(f"sweep finished in {time.time() - t0:.0f}s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    if not a.no_report:
        from scripts import compare

        return compare.main([str(study_dir)])
    return 0


def _write_index(path: Path, study: dict, runs: list[dict], index: dict) -> None:
    entries = [index[r["name"]] for r in runs if r["name"] in index]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"study": study, "runs": entries}, indent=2) + "\n")
    os.replace(tmp, path)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
