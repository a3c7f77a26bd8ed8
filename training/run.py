"""The life of a run, in one place: its directory and lock, whether it is new, to resume or
finished, the state saved and restored (.pt in one process or DDP, DCP when sharded; either kind
resumes under any parallelism), the resume's allowed config changes and LR-schedule horizon, stop
requests, and the outcome, decided once on rank 0.

train.py drives it: open_run -> start_state | resume_state -> (loop: save_state) -> decide_status.

Rank 0 alone reads and writes the run directory's files (config, meta, metrics, summary, a .pt
checkpoint) through distributed.on_master: whatever it finds or fails at reaches every rank, so no
rank trains on after it failed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

from filelock import FileLock, Timeout

from training import distributed, faults
from training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_full_state,
    load_newest,
    load_sharded,
    rng_state,
    save_checkpoint,
    save_sharded_checkpoint,
    set_rng_state,
    skipped,
)
from training.config import Config, ConfigError, flat, to_dict, to_yaml
from training.distributed import exit_now
from training.monitor import classify, dead_gradients_at
from training.optim import lr_at, peak_lr
from training.outcome import EXIT_INTERRUPTED
from training.parallel import is_sharded
from training.rundir import (
    RunDir,
    has_checkpoint,
    run_meta,
    truncate_metrics,
    write_json,
    write_text,
)


def open_run(
    cfg: Config, default_name: str, resume: bool, d: distributed.Dist
) -> tuple[RunDir, str, object]:
    """(run, how, lock): how is 'new', 'resume' (a checkpoint to continue from) or 'finished'. Rank
    0 decides and holds the run's lock (a second process with the same name is refused); every rank
    learns the decision, or the error, so all stop alike. Then every rank checks that it sees the
    run directory rank 0 uses and runs rank 0's config (same_run)."""
    held = {}

    def decide() -> tuple[str, str, str]:
        run = RunDir(run_directory(cfg, default_name, resume))
        lock = FileLock(str(run.lock))
        try:
            run.path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire(timeout=0)
        except Timeout:
            raise ConfigError(
                f"run {run.path} is in use by another process (lock {run.lock}); wait for "
                f"it to finish or choose another --name"
            ) from None
        held["lock"] = lock
        return (
            str(run.path),
            run_state(run, cfg.train.steps) if resume else "new",
            _token(run, d),
            f"{run.path.resolve()} on {socket.gethostname()}",
        )

    path, how, token, where = distributed.on_master(decide)
    cfg.log.name = Path(path).name
    run = RunDir(Path(path))
    if d.world_size > 1:
        same_run(run, token, where, cfg, d)
    faults.point("start")
    return run, how, held.get("lock")


def _token(run: RunDir, d: distributed.Dist) -> str:
    """Multi-process runs: a file beside the run directory with a fresh random token, for the others
    to read (same_run); its name."""
    if d.world_size == 1:
        return ""
    token = f".{run.name}.shared-{uuid.uuid4().hex[:12]}"
    write_text(run.path.parent / token, token)
    return token


def same_run(run: RunDir, token: str, where: str, cfg: Config, d: distributed.Dist) -> None:
    """Every rank must see the run directory rank 0 writes (multi-node: a file system every node
    shares; a directory per node would leave each sharded checkpoint in pieces and nothing to
    resume) and run the config rank 0 runs; otherwise ConfigError on every rank, naming the first
    rank that differs. The token file may take a moment to appear over a network file system: a rank
    looks for it for up to 5 s (NORMLAB_SHARED_WAIT_S)."""
    mine = Path(cfg.log.out_dir) / token
    error = None
    deadline = time.monotonic() + float(os.environ.get("NORMLAB_SHARED_WAIT_S", "5"))
    while not _holds(mine, token) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not _holds(mine, token):
        error = ConfigError(
            f"rank {d.rank} does not see the run directory rank 0 writes ({where}; rank {d.rank} "
            "looked in "
            f"{Path(cfg.log.out_dir).resolve() / run.name} on {socket.gethostname()}): every "
            "process of a run must "
            "read and write the same directory; put log.out_dir on a file system every node "
            "shares (a directory "
            f"per node cannot hold a sharded checkpoint: each node would keep only its own shards)"
        )
    try:
        distributed.agree(error)
    finally:
        if d.is_master:
            (run.path.parent / token).unlink(missing_ok=True)
    ours = flat(to_dict(cfg))
    theirs = distributed.broadcast_object(ours)
    key = next((k for k in ours if ours[k] != theirs.get(k)), None)
    if key is not None:
        error = ConfigError(
            f"rank {d.rank}'s config differs from rank 0's in {key} ({theirs.get(key)!r} on rank "
            "0, "
            f"{ours[key]!r} here): launch every process with the same command and files"
        )
    distributed.agree(error)


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text() == token
    except OSError:
        return False


def run_state(run: RunDir, steps: int) -> str:
    """'finished' (its summary has a final status for these steps), 'resume' (a checkpoint) or
    'new'."""
    summary = run.read_summary() or {}
    if (
        summary.get("status") == "diverged"
        or summary.get("status") in ("ok", "plateau", "collapsed", "unstable")
        and (summary.get("steps") or 0) >= steps
    ):
        return "finished"
    return "resume" if has_checkpoint(run.checkpoint) else "new"


def run_directory(cfg: Config, default_name: str, resume: bool) -> Path:
    """runs/<name>; a derived name gets a -2, -3... suffix rather than touching an existing run."""
    out = Path(cfg.log.out_dir)
    if cfg.log.name:
        run_dir = out / cfg.log.name
        if run_dir.exists() and not resume:
            raise ConfigError(
                f"run directory {run_dir} already exists: pass --resume to continue it, "
                f"or another --name"
            )
        return run_dir
    run_dir, i = out / default_name, 1
    while run_dir.exists():
        i += 1
        run_dir = out / f"{default_name}-{i}"
    cfg.log.name = run_dir.name
    return run_dir


def schedule_change(step: int, saved_horizon: int, cfg: Config) -> dict:
    """What a resume does to the LR schedule, for meta.json's `resumes` and the console.

    The horizon (optim.schedule_steps) is kept unless given anew: extending a run past it holds the
    final LR (a silent re-stretch of the cosine would jump the LR, and its spike would be blamed on
    the norm). An explicit optim.schedule_steps=N re-schedules from this step on, jump included, and
    says so."""
    horizon, steps = cfg.optim.schedule_steps, cfg.train.steps
    lr_before = lr_at(step - 1, cfg.optim, saved_horizon) if step else 0.0
    lr_after = lr_at(step, cfg.optim, horizon)
    event = {
        "at_step": step,
        "train.steps": steps,
        "schedule_steps": horizon,
        "previous_schedule_steps": saved_horizon,
        "lr_before": lr_before,
        "lr_after": lr_after,
        "note": "",
    }
    if horizon != saved_horizon:
        event["note"] = (
            f"LR re-scheduled at step {step}: horizon {saved_horizon} -> {horizon} steps "
            f"(optim.schedule_steps), lr {lr_before:.3g} -> {lr_after:.3g}"
        )
    elif steps > horizon:
        event["note"] = (
            f"train.steps={steps} extends the run past its {horizon}-step LR schedule: steps after "
            f"{horizon} hold the final lr {peak_lr(cfg.optim) * cfg.optim.min_lr_ratio:.3g} "
            f"(pass optim.schedule_steps=N to re-schedule instead)"
        )
    return event


class StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop at the next step boundary (the checkpoint is whole);
    a second one ends the process at once, even inside a long step: the last checkpoint (`saved`).

    The C-level handler writes each signal to a pipe at once (signal.set_wakeup_fd): a thread reads
    it while the main thread may be inside one long torch op, where Python-level handlers wait for
    it to return. Signals within GRACE_S of the first are one request (a terminal's Ctrl-C reaches
    torchrun and its processes, and torchrun sends it on)."""

    GRACE_S = 1.0
    # a request that arrives inside a step which has not ended this much later ends the process:
    # a long step (a huge window, a slow device) would otherwise keep torchrun's or SLURM's SIGTERM
    # waiting for minutes; the last checkpoint is whole
    STEP_GRACE_S = 5.0

    def __init__(self, say: bool = True, keep_on_error: bool = False):
        self.requested, self.saved, self.say, self.first = False, None, say, None
        self.steps = 0  # steps begun; in_step: inside one (the loop says so: step())
        self.in_step = False
        self.keep_on_error = keep_on_error  # the handler stays when the block raises
        self.previous = {s: signal.signal(s, self._note) for s in (signal.SIGINT, signal.SIGTERM)}
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, daemon=True).start()

    def _note(self, signum, frame):
        self.requested = True

    def _watch(self) -> None:
        while byte := os.read(self._read, 1):
            if byte[0] not in (signal.SIGINT, signal.SIGTERM):
                continue
            self.requested, now = True, time.monotonic()
            if self.first is None:
                self.first = now
                if self.in_step:  # if this step does not end soon, end the process
                    timer = threading.Timer(self.STEP_GRACE_S, self._deadline, [self.steps])
                    timer.daemon = True
                    timer.start()
            elif now - self.first >= self.GRACE_S:
                self._stop_now("interrupted again")
        os.close(self._read)

    def _deadline(self, step: int) -> None:
        if self.in_step and self.steps == step:
            self._stop_now(f"interrupted inside a step longer than {self.STEP_GRACE_S:g} s")

    def _stop_now(self, why: str) -> None:
        if self.say:
            kept = (
                "no checkpoint yet: --resume starts the run over"
                if self.saved is None
                else f"the last checkpoint (step {self.saved}) is intact: --resume continues "
                "from it"
            )
            # its own line after a progress bar's, and the last: nothing draws the bar again
            print(f"\n{why}: stopped at once; {kept}", file=sys.stderr, flush=True)
        exit_now(EXIT_INTERRUPTED)

    def step(self, inside: bool) -> None:
        """The loop enters (True) or leaves (False) a step (its update, evaluation and record)."""
        if inside:
            self.steps += 1
        self.in_step = inside

    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, kind, error, tb) -> None:
        if kind is None or not self.keep_on_error:
            self.restore()
        elif self.requested:  # torchrun's SIGTERM came first: leave() need not wait for it
            error.after_signal = True

    def restore(self) -> None:
        signal.set_wakeup_fd(self._wakeup)
        os.close(self._write)  # the thread reads the end of the pipe and ends
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def training_state(cfg: Config, loader, step: int, scaler) -> dict:
    """What a checkpoint holds besides the model and optimizer, for either kind: the loader's
    position, the RNG, the step, the LR horizon, the float16 loss scale."""
    return {
        "loader": loader.state_dict(),
        "rng": rng_state(),
        "step": step,
        "schedule_steps": cfg.optim.schedule_steps,
        **({"scaler": scaler.state_dict()} if scaler.is_enabled() else {}),
    }


def resume_state(
    run: RunDir, cfg: Config, d: distributed.Dist, *, model, opt, scaler, loader, machine: dict
):
    """Restore the newest readable checkpoint (load_newest: by step, .pt and DCP alike) into model,
    optimizer, loss scaler, loader and RNG; (its step, notes). A DCP directory reshards onto any
    parallelism; a .pt file's full state is distributed onto a sharded model."""

    def load(c) -> dict:
        if c.sharded:
            return load_sharded(c.path, model, opt)  # a collective: DCP raises on every rank
        return load_checkpoint(c.path)  # read only: agreed on before any rank applies it

    state, found, errors = load_newest(run.checkpoint, load)
    notes = [n for n in [skipped(errors, found)] if n]
    try:
        if not found.sharded:
            load_full_state(model, opt, state["model"], state["optimizer"])
        if scaler.is_enabled() and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        loader.load_state_dict(state["loader"])
        set_rng_state(state["rng"])
        step = state["step"]
    except CheckpointError:
        raise
    except Exception as e:  # any mismatch is one line and exit 2, never a traceback
        raise CheckpointError(
            f"checkpoint {found.path} does not fit this config: "
            f"{(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}"
        ) from None
    resumed = schedule_change(step, state.get("schedule_steps", cfg.optim.schedule_steps), cfg)

    def write() -> None:
        meta = read_meta(run)
        faults.point("resume")
        truncate_metrics(run.metrics, step)
        # extended past its end, a finished run is running again
        run.summary.unlink(missing_ok=True)
        write_text(run.config, to_yaml(cfg))  # with the allowed changes (e.g. train.steps)
        meta["resumes"] = meta.get("resumes", []) + [{**resumed, **machine}]
        write_json(run.meta, meta)

    distributed.on_master(write)
    return step, [*notes, *([resumed["note"]] if resumed["note"] else [])]


def read_meta(run: RunDir) -> dict:
    """A run's meta.json ({} when it has none); ConfigError (one line) when it cannot be read."""
    if not run.meta.is_file():
        return {}
    try:
        meta = json.loads(run.meta.read_text())
        if not isinstance(meta, dict):
            raise ValueError(f"a JSON {type(meta).__name__}, not an object")
        return meta
    except ValueError as e:
        raise ConfigError(
            f"{run.meta} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
            f"restore it, or delete it to resume without its record of earlier launches"
        ) from None


def start_state(
    run: RunDir, cfg: Config, d: distributed.Dist, model, data_meta: dict, machine: dict
):
    """Write a new run's directory (or start over one that has no checkpoint yet); (0, notes).
    Everything was validated before: only now does the run directory appear."""

    def write() -> list[str]:
        notes = []
        # --resume before any checkpoint: what a killed start left is started over
        if run.path.exists():
            notes.append(f"no checkpoint in {run.path} yet: starting from step 0")
            run.metrics.unlink(missing_ok=True)
            run.summary.unlink(missing_ok=True)
            # temp files of a killed first save
            shutil.rmtree(run.checkpoint.parent, ignore_errors=True)
        run.path.mkdir(parents=True, exist_ok=True)
        write_text(run.config, to_yaml(cfg))
        faults.point("config")
        write_json(
            run.meta,
            {**run_meta(model, d.device, cfg.train.dtype, d.world_size, data_meta), **machine},
        )
        return notes

    return 0, distributed.on_master(write)


def save_state(
    run: RunDir, cfg: Config, d: distributed.Dist, *, model, opt, loader, step: int, scaler
) -> None:
    """The full training state after `step` (rank 0 writes it; DDP replicas are identical); the
    float16 loss scale too, so a resumed run scales its next step as the uninterrupted one would. A
    sharded model (fsdp, tp) writes a DCP directory instead, every rank its shards (resumable on any
    number of processes)."""
    extra = training_state(cfg, loader, step, scaler)
    if is_sharded(model):
        save_sharded_checkpoint(run.checkpoint, model, opt, extra)
        return
    distributed.on_master(
        lambda: save_checkpoint(
            run.checkpoint, {"model": model.state_dict(), "optimizer": opt.state_dict(), **extra}
        )
    )


def decide_status(
    run: RunDir, cfg: Config, d: distributed.Dist, unigram_entropy: float | None
) -> str:
    """The outcome of a run that ran to its end, judged on its whole val curve (training/monitor.py)
    by rank 0, which reads the metrics it wrote, and broadcast (or its error): every rank exits with
    the same verdict."""

    def judge() -> str:
        records = run.records()
        evals = [(r["step"], r.get("val/loss")) for r in records if "val/loss" in r]
        init = next((v for s, v in evals if s == 0), None)
        later = [(s, v) for s, v in evals if s > 0]
        return classify(
            [v for _, v in later],
            unigram_entropy,
            cfg.log.plateau_margin,
            init,
            cfg.log.blowup_margin,
            [s for s, _ in later],
            cfg.log.flat_horizon,
            dead_gradients_at(records),
        )

    return distributed.on_master(judge)
