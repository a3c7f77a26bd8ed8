"""Train a Llama from a YAML config; the norm and its placement are one flag away.

    python train.py                                     # configs/default.yaml on the embedded corpus
    python train.py --norm layernorm --placement post optim.lr=1e-2 train.steps=300
    python train.py --name my-run --resume              # continue runs/my-run exactly where it stopped
    torchrun --nproc_per_node 2 train.py ...            # data parallel: gloo on CPU, nccl on GPU

Writes runs/<name>/: config.yaml, meta.json, metrics.jsonl, summary.json, checkpoints/latest.pt.

Exit codes: 0 finished (status ok or plateau; or stopped at train.stop_at, resumable; or --resume of a run
that had already finished), 2 bad input (config, command line, data or checkpoint; nothing is written),
3 diverged (a result: logs and summary are complete), 4 the run's files could not be written (disk full:
the last checkpoint is intact), 130 interrupted by Ctrl-C / SIGTERM (checkpoint saved; --resume).

--resume is safe on every launch, as a preemptible scheduler relaunches a job: with no run directory or no
checkpoint yet it starts from step 0, with a checkpoint it continues exactly (from previous.pt if latest.pt
is unreadable), with a finished run it exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from filelock import FileLock, Timeout

from data.loader import BatchLoader, eval_batches, load_tokens, read_meta
from data.prepare import prepare
from data.sources import DataError
from data.tokenizer import Tokenizer
from fused import kernel_paths
from model import Llama
from model.blocks import BLOCKS
from model.norms import NORMS
from training import distributed, faults
from training.checkpoint import (
    CheckpointError,
    has_checkpoint,
    has_pt,
    load_latest,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from training.config import Config, ConfigError, flat, load_config, to_dict, to_yaml
from training.cpu import tune_cpu
from training.flops import flops_per_token, peak_flops
from training.logger import Logger
from training.metrics import StabilityProbe
from training.monitor import classify
from training.optim import build_optimizer, lr_at
from training.parallel import (
    data_coords,
    dcp_candidates,
    full_model_state,
    is_sharded,
    load_full_state,
    load_sharded,
    save_sharded_checkpoint,
    shard_model,
)
from training.runinfo import RunDir, run_meta, summarize, truncate_metrics, write_json, write_text
from training.step import Every, StepParts, autocast_for, no_clip, scaler_for, train_step

EXIT_OK, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_STORAGE, EXIT_INTERRUPTED = 0, 2, 3, 4, 130
REPO = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO / "configs" / "default.yaml"
# what a resumed run may change: its length and how it runs, not what it trains
RESUMABLE = ("train.steps", "optim.schedule_steps", "train.stop_at", "train.checkpoint_every", "train.eval_every",
             "train.threads", "train.malloc_tuning", "train.sample_tokens", "log.out_dir", "log.wandb",
             "log.wandb_project",
             # how it is spread over processes (a resume on another count splits the same global batch)
             "train.parallel", "train.tp_size", "train.micro_batch_size")


def parse_cli(argv: list[str] | None) -> tuple[Config, bool, str]:
    """(config, resume, default run name) from the command line: defaults < YAML < flags and key=value."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help=f"YAML config (default: {DEFAULT_CONFIG.relative_to(REPO)})")
    p.add_argument("--norm", help=f"model.norm: {' | '.join(NORMS)}")
    p.add_argument("--placement", help=f"model.placement: {' | '.join(BLOCKS)}")
    p.add_argument("--name", help="run name: the run directory is <log.out_dir>/<name>")
    p.add_argument("--resume", action="store_true", help="continue the run --name from its checkpoint")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any config field, e.g. optim.lr=3e-3")
    a = p.parse_intermixed_args(argv)  # flags and key=value overrides in any order
    flags = {"model.norm": a.norm, "model.placement": a.placement, "log.name": a.name}
    flags = {k: v for k, v in flags.items() if v is not None}
    config = Path(a.config) if a.config else DEFAULT_CONFIG
    cfg = load_config(config, a.overrides, flags)
    if a.resume:
        if not cfg.log.name:
            raise ConfigError("--resume needs --name (the run to continue, or to start if it does not exist yet)")
        saved = Path(cfg.log.out_dir) / cfg.log.name / "config.yaml"
        if saved.is_file():  # continue with the saved config: the checkpoint holds a model and optimizer built from it
            cfg = resumed_config(saved, cfg if a.config else None, a.overrides, flags)
    return cfg, a.resume, f"{config.stem}-{cfg.model.norm}-{cfg.model.placement}"


def resumed_config(saved: Path, given: Config | None, overrides: list[str], flags: dict) -> Config:
    """The saved config with the allowed changes of a --resume. A --config given again (a scheduler relaunching the
    same command) must agree with the saved run on everything outside RESUMABLE."""
    changed = [o.split("=", 1)[0] for o in overrides] + [k for k in flags if k != "log.name"]
    if given is not None:
        before, now = flat(to_dict(load_config(saved))), flat(to_dict(given))
        differ = [k for k in now if k not in RESUMABLE and k != "log.name" and now[k] != before.get(k)]
        if differ:
            raise ConfigError(f"--resume: the command's config differs from the saved {saved} in {differ[0]} "
                              f"({before.get(differ[0])!r} -> {now[differ[0]]!r}); a resume may change only: "
                              f"{', '.join(RESUMABLE)}")
        changed = [k for k in changed if k in RESUMABLE]  # the others were just checked equal
    fixed = [k for k in changed if k not in RESUMABLE]
    if fixed:
        raise ConfigError(f"--resume cannot change {fixed[0]}; it may change: {', '.join(RESUMABLE)}")
    flags = dict(flags)
    if "optim.schedule_steps" not in changed:  # the horizon the run was scheduled with (older runs: its steps)
        flags["optim.schedule_steps"] = load_config(saved).optim.schedule_steps
    return load_config(saved, [o for o in overrides if o.split("=", 1)[0] in changed], flags)


def open_run(cfg: Config, default_name: str, resume: bool, d: distributed.Dist) -> tuple[RunDir, str, object]:
    """(run, how, lock): how is 'new', 'resume' (a checkpoint to continue from) or 'finished'. Rank 0 decides
    and holds the run's lock (a second process with the same name is refused); every rank learns the decision,
    or the error, so all stop alike."""
    found, lock = None, None
    if d.is_master:
        try:
            run = RunDir(run_directory(cfg, default_name, resume))
            lock = FileLock(str(run.lock))
            try:
                run.path.parent.mkdir(parents=True, exist_ok=True)
                lock.acquire(timeout=0)
            except Timeout:
                raise ConfigError(f"run {run.path} is in use by another process (lock {run.lock}); wait for "
                                  f"it to finish or choose another --name") from None
            found = ("ok", str(run.path), run_state(run, cfg.train.steps) if resume else "new")
        except (ConfigError, OSError) as e:
            found = ("error", str(e), None)
    kind, value, how = distributed.broadcast_object(found)
    if kind == "error":
        raise ConfigError(value)
    cfg.log.name = Path(value).name
    faults.point("start")
    return RunDir(Path(value)), how, lock


def run_state(run: RunDir, steps: int) -> str:
    """'finished' (its summary has a final status for these steps), 'resume' (a checkpoint) or 'new'."""
    summary = run.read_summary() or {}
    if summary.get("status") == "diverged" or summary.get("status") in ("ok", "plateau", "unstable") \
            and (summary.get("steps") or 0) >= steps:
        return "finished"
    return "resume" if has_checkpoint(run.checkpoint) else "new"


def run_directory(cfg: Config, default_name: str, resume: bool) -> Path:
    """runs/<name>; a derived name gets a -2, -3... suffix rather than touching an existing run."""
    out = Path(cfg.log.out_dir)
    if cfg.log.name:
        run_dir = out / cfg.log.name
        if run_dir.exists() and not resume:
            raise ConfigError(f"run directory {run_dir} already exists: pass --resume to continue it, "
                              f"or another --name")
        return run_dir
    run_dir, i = out / default_name, 1
    while run_dir.exists():
        i += 1
        run_dir = out / f"{default_name}-{i}"
    cfg.log.name = run_dir.name
    return run_dir


def schedule_change(step: int, saved_horizon: int, cfg: Config) -> dict:
    """What a resume does to the LR schedule, for meta.json's `resumes` and the console.

    The horizon (optim.schedule_steps) is kept unless given anew: extending a run past it holds the final LR
    (a silent re-stretch of the cosine would jump the LR, and its spike would be blamed on the norm). An explicit
    optim.schedule_steps=N re-schedules from this step on, jump included, and says so."""
    horizon, steps = cfg.optim.schedule_steps, cfg.train.steps
    lr_before = lr_at(step - 1, cfg.optim, saved_horizon) if step else 0.0
    lr_after = lr_at(step, cfg.optim, horizon)
    event = {"at_step": step, "train.steps": steps, "schedule_steps": horizon, "previous_schedule_steps": saved_horizon,
             "lr_before": lr_before, "lr_after": lr_after, "note": ""}
    if horizon != saved_horizon:
        event["note"] = (f"LR re-scheduled at step {step}: horizon {saved_horizon} -> {horizon} steps "
                         f"(optim.schedule_steps), lr {lr_before:.3g} -> {lr_after:.3g}")
    elif steps > horizon:
        event["note"] = (f"train.steps={steps} extends the run past its {horizon}-step LR schedule: steps after "
                         f"{horizon} hold the final lr {cfg.optim.lr * cfg.optim.min_lr_ratio:.3g} "
                         f"(pass optim.schedule_steps=N to re-schedule instead)")
    return event


class StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop at the next step boundary (so the checkpoint is whole);
    a second Ctrl-C stops at once."""

    def __init__(self):
        self.requested = False
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


@torch.no_grad()
def evaluate(model: Llama, tokens, cfg: Config, d: distributed.Dist, autocast, batch_size: int) -> tuple[float, float]:
    """(mean next-token loss, its standard error) over the fixed validation set (the same tokens at every eval).

    The standard error is over windows (seq_len tokens each): sd of the per-window mean losses / sqrt(windows).
    Windows are consecutive text, so it is the eval's own sampling noise, a lower bound if windows correlate."""
    model.eval()
    # (sum of losses over tokens, tokens, sum of per-window means, sum of their squares, windows)
    total = torch.zeros(5, device=d.device, dtype=torch.float64)
    for x, y, counts in eval_batches(tokens, cfg.train.seq_len, batch_size, cfg.train.eval_tokens, d.data_rank,
                                     d.data_world):
        x, y = x.to(d.device), y.to(d.device)
        with autocast:  # every rank runs as many forwards as the others (padding batches count 0)
            logits, loss = model(x, y)
        if counts:
            per_window = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
            w = per_window.double().mean(1)
            total += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), device=d.device).double(),
                                  w.sum(), w.pow(2).sum(), torch.tensor(len(w), device=d.device).double()])
        faults.point("eval")
    model.train()
    distributed.all_reduce(total)
    total /= d.world_size // d.data_world  # the ranks of a tensor-parallel group counted the same windows
    loss_sum, n_tokens, s1, s2, n = total.tolist()
    var = max(0.0, (s2 - s1 * s1 / n) / (n - 1)) if n > 1 else 0.0
    return loss_sum / n_tokens, math.sqrt(var / n) if n > 1 else float("nan")


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, resume, default_name = parse_cli(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    d = distributed.setup(cfg.train.device)
    try:
        return train(cfg, resume, default_name, d)
    except (ConfigError, DataError, CheckpointError) as e:
        if d.is_master:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # disk full, permissions, a vanished file system: checkpoints are written atomically
        print(f"error: cannot write the run's files: {e}; the last checkpoint is intact (--resume continues "
              f"from it)", file=sys.stderr)
        return EXIT_STORAGE
    except KeyboardInterrupt:  # before the training loop (e.g. while preparing data): nothing to save
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        distributed.teardown()


def train(cfg: Config, resume: bool, default_name: str, d: distributed.Dist) -> int:
    t_start, tc = time.time(), cfg.train
    d.data_rank, d.data_world = data_coords(d.rank, d.world_size, tc.parallel, tc.tp_size)
    cpu = tune_cpu(tc.threads, tc.malloc_tuning) if d.device.type == "cpu" else None
    data = open_data(cfg, d)
    # which fused kernels run and which paths fall back, built / loaded now rather than inside the first step
    kernels = kernel_paths(d.device.type, cfg.model.norm_impl, cfg.model.ops_impl)
    torch.manual_seed(tc.seed)  # the same seed gives the same weights whatever the norm or placement
    model = Llama(cfg.model).to(d.device)
    try:  # DDP wraps; FSDP2 / tensor parallel shard the parameters in place, before the optimizer sees them
        wrapped = shard_model(model, tc.parallel, tc.dtype, tc.tp_size)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    opt = build_optimizer(model, cfg.optim)
    run, how, lock = open_run(cfg, default_name, resume, d)  # noqa: F841  (the lock is held while `train` runs)
    if how == "finished":
        if d.is_master:
            print(f"run {run.path} already finished ({run.status()}); nothing to do (pass train.steps=N to "
                  f"train further)", file=sys.stderr)
        return EXIT_OK
    scaler = scaler_for(d.device, tc.dtype)
    start_step, notes = (resume_state if how == "resume" else start_state)(run, cfg, d, model, opt, scaler, data,
                                                                           {"kernels": kernels, "cpu": cpu})
    parts = StepParts(model, wrapped, torch.compile(wrapped) if tc.compile else wrapped, opt, data.micro,
                      data.accum, d.world_size, d.device, autocast_for(d.device, tc.dtype), tc.z_loss,
                      no_clip(cfg.optim.grad_clip), tc.batch_size * tc.seq_len, scaler,
                      flops_per_token(cfg.model, tc.seq_len) * tc.batch_size * tc.seq_len,
                      peak_flops(torch.cuda.get_device_name(d.device), tc.dtype) if d.device.type == "cuda" else None)
    logger = Logger(run.path if d.is_master else None, run.name, tc.steps, start_step, cfg.log.wandb,
                    cfg.log.wandb_project, to_dict(cfg))
    announce(logger, run, cfg, d, model, data, kernels, notes, start_step)
    probe = StabilityProbe(model, Every(cfg.log.stats_every, first=True))
    evals, checkpoints = Every(tc.eval_every, tc.steps), Every(tc.checkpoint_every, tc.steps)
    status, diverged_at, done, planned_stop = "ok", None, start_step, False
    if start_step == 0:  # L0: the val loss before the first step, the same kind of number as every later eval
        l0, se = evaluate(model, data.val_tokens, cfg, d, parts.autocast, data.micro)
        logger.log(0, {"val/loss": l0, "val/loss_se": se})
    stop = StopRequest()  # from here on Ctrl-C stops at a step boundary, leaving a resumable checkpoint
    try:
        for step in range(start_step, tc.steps):
            # one optimizer step at this step's learning rate; the probe observes the steps it is due on
            record = train_step(parts, next(data.loader), lr_at(step, cfg.optim, cfg.optim.schedule_steps),
                                probe if probe.due(step + 1) else None)
            done = step + 1
            faults.point("step")
            # a non-finite loss or gradient norm: no update was made; it is logged and the run ends
            if record.pop("diverged"):
                status, diverged_at = "diverged", done
                logger.log(done, record)
                logger.message(f"diverged at step {done}: loss {record['train/loss']}, grad norm {record['grad/norm']}")
                break
            # validation, on its cadence and at the last step
            if evals.due(done):
                record["val/loss"], record["val/loss_se"] = evaluate(model, data.val_tokens, cfg, d, parts.autocast,
                                                                     data.micro)
                logger.message(f"step {done}: train loss {record['train/loss']:.4f}, val loss {record['val/loss']:.4f}")
            logger.log(done, record)
            faults.point("log")
            # stop at train.stop_at, or on Ctrl-C / SIGTERM on any rank; a request during the last step lets it end
            planned_stop = done == tc.stop_at and done < tc.steps
            stop_now = (planned_stop or distributed.any_rank(stop.requested, d.device)) and done < tc.steps
            # a checkpoint on its cadence, at the last step and before stopping
            if checkpoints.due(done) or stop_now:
                save_state(run, cfg, d, model, opt, data.loader, done, scaler)
            if stop_now:
                status = "interrupted"
                why = f"train.stop_at={done}" if planned_stop else "interrupted"
                logger.message(f"stopped at step {done} ({why}); continue with --name {run.name} --resume")
                break
    except KeyboardInterrupt:  # a second Ctrl-C: the last checkpoint stays the resumable state
        status = "interrupted"
    except Exception:  # e.g. a full disk: close the progress bar and logs first, so the error is the last line
        logger.close()
        raise
    finally:
        stop.restore()
    status, diverged_at = finish(run, cfg, d, model, data, logger, status, diverged_at, done, t_start)
    if status == "diverged":
        return EXIT_DIVERGED
    return EXIT_INTERRUPTED if status == "interrupted" and not planned_stop else EXIT_OK


@dataclass
class Data:
    prepared: Path
    meta: dict
    loader: BatchLoader
    val_tokens: object
    micro: int  # sequences per forward pass and process
    accum: int  # micro-batches per optimizer step


def open_data(cfg: Config, d: distributed.Dist) -> Data:
    """The prepared dataset (built once, cached; concurrent processes wait), its loader and the val tokens."""
    tc = cfg.train
    prepared = prepare(**vars(cfg.data), verbose=d.is_master)  # DataConfig's fields are prepare()'s arguments
    per_rank = tc.batch_size // d.data_world
    micro = tc.micro_batch_size or per_rank
    if tc.batch_size % d.data_world or per_rank % micro:
        raise ConfigError(f"train.batch_size={tc.batch_size} must split evenly into {d.data_world} data-parallel "
                          f"shares x micro batches of train.micro_batch_size={micro}")
    loader = BatchLoader(load_tokens(prepared, "train"), tc.seq_len, tc.batch_size, tc.seed, d.data_rank,
                         d.data_world)
    val_tokens = load_tokens(prepared, "val")
    eval_batches(val_tokens, tc.seq_len, micro, tc.eval_tokens)  # too few val tokens: fail before any output
    return Data(prepared, read_meta(prepared), loader, val_tokens, micro, per_rank // micro)


def resume_state(run: RunDir, cfg: Config, d: distributed.Dist, model, opt, scaler, data: Data, machine: dict):
    """Restore the newest readable checkpoint into model, optimizer, loss scaler, loader and RNG; (its step,
    notes). A DCP directory (latest.dcp, else previous.dcp) or a .pt file, whichever is newer, loads into any
    parallelism: DCP reshards, a .pt's full state is distributed onto a sharded model."""
    notes, state, dcp_error = [], None, None
    for path in dcp_candidates(run.checkpoint):  # written by a sharded run, newer than any latest.pt
        try:
            state = load_sharded(path, model, opt)
            if dcp_error:
                notes.append(f"{dcp_error}: resumed from {path.name} (step {state.get('step')})")
            break
        except CheckpointError as e:
            dcp_error = dcp_error or str(e)
    try:
        if state is None:
            if dcp_error and not has_pt(run.checkpoint):
                raise CheckpointError(dcp_error)
            state, fallback = load_latest(run.checkpoint)
            notes += [n for n in (dcp_error and f"{dcp_error}: resumed from the older .pt", fallback) if n]
            load_full_state(model, opt, state["model"], state["optimizer"])
        if scaler.is_enabled() and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        data.loader.load_state_dict(state["loader"])
        set_rng_state(state["rng"])
        step = state["step"]
    except CheckpointError:
        raise
    except Exception as e:  # any mismatch is one line and exit 2, never a traceback
        raise CheckpointError(f"checkpoint {run.checkpoint} does not fit this config: "
                              f"{(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}") from None
    resumed = schedule_change(step, state.get("schedule_steps", cfg.optim.schedule_steps), cfg)
    if d.is_master:
        truncate_metrics(run.metrics, step)
        write_text(run.config, to_yaml(cfg))  # with the allowed changes (e.g. train.steps)
        meta = json.loads(run.meta.read_text()) if run.meta.is_file() else {}
        meta["resumes"] = meta.get("resumes", []) + [{**resumed, **machine}]
        write_json(run.meta, meta)
    return step, [*notes, *([resumed["note"]] if resumed["note"] else [])]


def start_state(run: RunDir, cfg: Config, d: distributed.Dist, model, opt, scaler, data: Data, machine: dict):
    """Write a new run's directory (or start over one that has no checkpoint yet); (0, notes). Everything was
    validated before: only now does the run directory appear."""
    notes = []
    if d.is_master:
        if run.path.exists():  # --resume before any checkpoint: what a killed start left is started over
            notes.append(f"no checkpoint in {run.path} yet: starting from step 0")
            run.metrics.unlink(missing_ok=True)
            run.summary.unlink(missing_ok=True)
            shutil.rmtree(run.checkpoint.parent, ignore_errors=True)  # temp files of a killed first save
        run.path.mkdir(parents=True, exist_ok=True)
        write_text(run.config, to_yaml(cfg))
        faults.point("config")
        write_json(run.meta, {**run_meta(model, d.device, cfg.train.dtype, d.world_size, data.meta), **machine})
    return 0, notes


def save_state(run: RunDir, cfg: Config, d: distributed.Dist, model, opt, loader, step: int, scaler) -> None:
    """The full training state after `step` (rank 0 writes it; DDP replicas are identical); the float16 loss
    scale too, so a resumed run scales its next step as the uninterrupted one would. A sharded model (fsdp, tp)
    writes a DCP directory instead, every rank its shards (resumable on any number of processes)."""
    if is_sharded(model):
        save_sharded_checkpoint(run.checkpoint, model, opt, {
            "loader": loader.state_dict(), "rng": rng_state(), "step": step,
            "schedule_steps": cfg.optim.schedule_steps,
            **({"scaler": scaler.state_dict()} if scaler.is_enabled() else {})})
        return
    if d.is_master:
        save_checkpoint(run.checkpoint, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                         "loader": loader.state_dict(), "rng": rng_state(), "step": step,
                                         "schedule_steps": cfg.optim.schedule_steps,
                                         **({"scaler": scaler.state_dict()} if scaler.is_enabled() else {})})


def announce(logger: Logger, run: RunDir, cfg: Config, d: distributed.Dist, model, data: Data, kernels: dict,
             notes: list[str], start_step: int) -> None:
    """The run's first lines: what trains where, which fast paths fall back, what a resume changed."""
    if not d.is_master:
        return
    tc = cfg.train
    logger.message(f"run {run.path} | {model.num_params():,} parameters | {cfg.model.norm} {cfg.model.placement}"
                   f" | {tc.batch_size}x{tc.seq_len} tokens/step ({data.accum} micro-batches x {d.world_size} "
                   f"processes) | {d.device} {tc.dtype}" + (f" | resumed at step {start_step}" if start_step else ""))
    fallbacks = [f"{op}: {path}" for op, path in kernels.items() if op != "build" and path.startswith("reference (")]
    for note in (["fast paths that fall back: " + "; ".join(fallbacks)] if fallbacks else []) + notes:
        logger.message(note)


def finish(run: RunDir, cfg: Config, d: distributed.Dist, model, data: Data, logger: Logger, status: str,
           diverged_at: int | None, done: int, t_start: float) -> tuple[str, int | None]:
    """Classify a run that ran to its end on its whole val curve, sample from one that learned, write
    summary.json; (status, diverged_at)."""
    tc = cfg.train
    if status == "ok":
        if d.is_master:  # rank 0 reads the metrics it wrote (other nodes may not share its file system)...
            evals = [(r["step"], r.get("val/loss")) for r in run.records() if "val/loss" in r]
            init = next((v for s, v in evals if s == 0), None)
            status = classify([v for s, v in evals if s > 0], data.meta.get("unigram_entropy"),
                              cfg.log.plateau_margin, init, cfg.log.blowup_margin)
        status = distributed.broadcast_object(status)  # ...and every rank exits with its verdict
        diverged_at = done if status == "diverged" else None  # a non-finite final val loss
        if tc.sample_tokens and status == "ok":  # only a run that learned (NaN logits cannot)
            sampler = model
            if is_sharded(model):  # rank 0 samples from an unsharded copy; gathering it is every rank's part
                state = full_model_state(model)
                sampler = Llama(cfg.model).to(d.device) if d.is_master else None
                if sampler is not None:
                    sampler.load_state_dict(state)
            if d.is_master:
                logger.message("sample: " + sample(sampler, data.prepared, tc, d.device,
                                                   autocast_for(d.device, tc.dtype)))
    summary = None
    faults.point("summary")
    if d.is_master:
        summary = summarize(run.records(), status, done, tc.steps, diverged_at, data.meta.get("unigram_entropy"),
                            cfg.log.spike_window, cfg.log.spike_k, time.time() - t_start)
        write_json(run.summary, summary)
        final = summary["final_val_loss"]
        logger.message(f"{status}: final val loss {'-' if final is None else f'{final:.4f}'} (unigram entropy "
                       f"{summary['unigram_entropy']:.3f}), {summary['tokens_per_s'] or 0:,.0f} tokens/s -> {run.path}")
    logger.close(summary)
    return status, diverged_at


def sample(model: Llama, prepared: Path, tc, device: torch.device, autocast) -> str:
    """A short sampled continuation of a fixed prompt (seeded: the same text for the same weights, on every rank),
    in the run's precision."""
    tok = Tokenizer(prepared / "tokenizer.model")
    prompt = torch.tensor([tok.encode("The ")], device=device)
    gen = torch.Generator(device=device).manual_seed(tc.seed)
    model.eval()
    with autocast:
        out = model.generate(prompt, tc.sample_tokens, temperature=0.8, top_k=50, generator=gen)
    model.train()
    return repr(tok.decode(out[0].tolist()))


if __name__ == "__main__":
    sys.exit(main())
