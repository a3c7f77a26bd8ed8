"""Train a Llama from a YAML config; the norm and its placement are one flag away.

    python train.py                                   # configs/train/default.yaml, embedded corpus
    python train.py --norm layernorm --placement post optim.lr=1e-2 train.steps=300
    python train.py --name my-run --resume            # continue runs/my-run where it stopped
    torchrun --standalone --nproc_per_node 2 train.py # data parallel: gloo on CPU, nccl on GPU

Writes runs/<name>/: config.yaml, meta.json, metrics.jsonl, summary.json, checkpoints/latest.pt.
Outcomes, exit codes and the resume rules: docs/usage.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO / "configs" / "train" / "default.yaml"


def cli() -> argparse.ArgumentParser:
    """The command line, built without torch: --help answers at once (a norm or placement not in
    its registry is refused with the valid names)."""
    head, _, tail = __doc__.partition("\n\n")
    from training.errors import Parser

    p = Parser(description=head, epilog=tail, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help=f"YAML config (default: {DEFAULT_CONFIG.relative_to(REPO)})")
    p.add_argument("--norm", help="model.norm: a name in model/norm_config.py NORMS (rmsnorm, ...)")
    p.add_argument(
        "--placement", help="model.placement: a name in model/blocks.py BLOCKS (pre, ...)"
    )
    p.add_argument("--name", help="run name: the run directory is <log.out_dir>/<name>")
    p.add_argument("--resume", action="store_true", help="continue the run --name (its checkpoint)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config fields: optim.lr=3e-3")
    return p


def read_cli(argv: list[str] | None):
    """(arguments, config path, config merged from defaults, YAML and flags): torch-free, so that
    a bad path, YAML or key is said before torch loads; validate() checks the rest."""
    from training.config import merge_config

    a = cli().parse_intermixed_args(argv)  # flags and key=value overrides in any order
    flags = {"model.norm": a.norm, "model.placement": a.placement, "log.name": a.name}
    flags = {k: v for k, v in flags.items() if v is not None}
    config = Path(a.config) if a.config else DEFAULT_CONFIG
    return a, config, flags, merge_config(config, a.overrides, flags)


if __name__ == "__main__":
    from training.config import ConfigError

    try:  # --help, usage errors and a bad config file end here, before torch is imported
        read_cli(None)
    except ConfigError as e:
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:  # under torchrun rank 0 says it for all
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

import time  # the imports from here on take seconds (torch)
from dataclasses import dataclass

import torch

from fused import fallen_back
from model import Llama
from normlab.layout import normlab_layout
from normlab.probe import StabilityProbe
from training import distributed, faults
from training.checkpoint import full_model_state
from training.config import Config, ConfigError, resumed_config, to_dict
from training.config import validate as validate_config
from training.evaluate import evaluate, sample
from training.inputs import Data, describe, inputs, prepare  # noqa: F401  (the lab's: DESIGN.md)
from training.logger import Logger
from training.optim import lr_at
from training.outcome import cannot_join, finished, leave, outcome, result_line, status_code
from training.parallel import is_sharded, shard_model
from training.run import StopRequest, decide_status, open_run, resume_state, save_state, start_state
from training.rundir import RunDir, summarize, write_json
from training.step import NO_PROBE, Every, StepParts, step_parts, train_step


def on_rank_0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def parse_cli(argv: list[str] | None) -> tuple[Config, bool, str]:
    """(config, resume, default run name): defaults < YAML < flags and key=value."""
    a, config, flags, merged = read_cli(argv)
    frac, warmup = merged.optim.warmup_fraction, merged.optim.warmup_steps
    cfg = validate_config(merged)
    asked = f"optim.warmup_steps={warmup}"  # the warmup asked for, before it was shortened
    if frac:
        warmup = round(frac * cfg.optim.schedule_steps)
        asked = f"optim.warmup_fraction={frac} ({warmup} steps)"
    saved = Path(cfg.log.out_dir) / (cfg.log.name or "") / "config.yaml"
    if a.resume and not cfg.log.name:
        raise ConfigError("--resume needs --name: the run to continue (or to start, if new)")
    if a.resume and saved.is_file():  # the checkpoint holds a model and optimizer built from it
        cfg = resumed_config(saved, cfg if a.config else None, a.overrides, flags)
    elif warmup >= cfg.optim.schedule_steps and on_rank_0():  # a new run's shortened warmup
        print(
            f"note: {asked} is not shorter than the schedule's "
            f"{cfg.optim.schedule_steps} steps (the LR would never reach optim.lr): warmup "
            f"shortened to {cfg.optim.warmup_steps} steps, 10% of it",
            file=sys.stderr,
        )
    return cfg, a.resume, f"{config.stem}-{cfg.model.norm}-{cfg.model.placement}"


def main(argv: list[str] | None = None) -> int:
    """One run: parse, join the job, train; the exit code (docs/usage.md)."""
    faults.reset()  # fault-injection counts are per run, also when a driver calls main() again
    cfg, resume, name, error = None, False, "", None
    try:
        cfg, resume, name = parse_cli(argv)
    except ConfigError as e:
        error = e
    if error is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return leave(distributed.Dist(), *outcome(error, distributed.Dist()))
    try:  # under torchrun a bad command line joins the job too: rank 0 says it for all
        d = distributed.setup(cfg.train.device if cfg else "auto")
    except Exception as e:
        return leave(distributed.Dist(), *cannot_join(e))
    try:
        distributed.agree(error)
        code, line, error = train(cfg, resume, name, d), "", None
    except SystemExit:  # asked to end now (a scheduler's handler: submitit requeues the run)
        raise
    except BaseException as e:  # noqa: B036  (Ctrl-C before the loop too: nothing to save)
        (code, line), error = outcome(e, d), e
    return leave(d, code, line, error)


@dataclass
class Run:
    """One run's state, from build() to finish(): what it trains, where, and how far it got."""

    cfg: Config
    d: distributed.Dist
    dir: RunDir
    how: str  # new | resume | finished
    lock: object  # rank 0's lock on the run, released however the run ends
    data: Data
    machine: dict  # kernels, CPU settings, the memory estimate (meta.json)
    model: Llama
    parts: StepParts  # the model as a step runs it, its optimizer, the batch split, the precision
    t_start: float
    logger: Logger | None = None
    step: int = 0  # optimizer steps done
    status: str = "ok"
    diverged_at: int | None = None
    planned_stop: bool = False  # stopped at train.stop_at (exit 0), not by a signal (130)


def train(cfg: Config, resume: bool, default_name: str, d: distributed.Dist) -> int:
    """Build the run, then train it to its end (or find it finished); the exit code."""
    run = build(cfg, resume, default_name, d)
    try:
        if run.how == "finished":  # a relaunch: nothing to do, the exit code it ended with
            return finished(run.dir, run.d.is_master)
        start(run)
        loop(run)
        return finish(run)
    finally:  # however it ends: the progress bar and files closed, the lock released
        if run.logger is not None:
            run.logger.close()
        if run.lock is not None:
            run.lock.release()


def build(cfg: Config, resume: bool, default_name: str, d: distributed.Dist) -> Run:
    """Check the inputs, build the model and optimizer, then open the run's directory."""
    t_start, tc = time.time(), cfg.train
    try:  # a bad input on any rank is every rank's error, said once
        (data, machine), error = inputs(cfg, d), None
    except Exception as e:
        data, machine, error = None, None, e
    distributed.agree(error)
    torch.manual_seed(tc.seed)  # the same seed, the same weights whatever the norm or placement
    model = Llama(cfg.model).to(d.device)
    wrapped = shard_model(model, tc.parallel, tc.dtype, tc.tp_size)  # DDP, or sharded in place
    parts = step_parts(cfg, d, model, wrapped, (data.micro, data.accum))
    run_dir, how, lock = open_run(cfg, default_name, resume, d)
    return Run(cfg, d, run_dir, how, lock, data, machine, model, parts, t_start)


def start(run: Run) -> None:
    """Restore the newest checkpoint or write a new run's files; the logger; the first lines."""
    cfg, d, tc = run.cfg, run.d, run.cfg.train
    warnings, notes = [], []
    if run.how == "resume":  # a skipped (damaged) checkpoint is a warning
        run.step, warnings = resume_state(
            run.dir,
            cfg,
            d,
            model=run.model,
            opt=run.parts.opt,
            scaler=run.parts.scaler,
            loader=run.data.loader,
            machine=run.machine,
        )
    else:
        run.step, notes = start_state(run.dir, cfg, d, run.model, run.data.meta, run.machine)
    run.logger = Logger(
        run.dir.path if d.is_master else None,  # only rank 0 logs
        name=run.dir.name,
        total_steps=tc.steps,
        start_step=run.step,
        wandb_mode=cfg.log.wandb,
        wandb_project=cfg.log.wandb_project,
        config=to_dict(cfg),
        tensorboard=cfg.log.tensorboard,
    )
    tp = d.world_size // d.data_world  # the batch's split, said only where there is one
    parts = [
        (run.parts.accum, "micro-batches"),
        (d.data_world, "data shares"),
        (tp, "tensor parallel"),
    ]
    split = " x ".join(f"{n} {what}" for n, what in parts if n > 1)
    resumed = f" | resumed at step {run.step}" if run.step else ""
    cpu = run.machine["cpu"]
    n = cpu["threads"] if cpu else 0
    threads = f", {n} thread{'s' * (n != 1)} ({cpu['threads_why']})" if cpu else ""
    run.logger.message(
        f"run {run.dir.path} | {run.model.num_params():,} parameters | {cfg.model.norm} "
        f"{cfg.model.placement} | {tc.batch_size}x{tc.seq_len} tokens/step"
        f"{f' ({split})' if split else ''} | {d.device} {tc.dtype}{threads}{resumed}"
    )
    fallbacks = "; ".join(fallen_back(run.machine["kernels"]))
    for warning in ([f"fast paths that fall back: {fallbacks}"] if fallbacks else []) + warnings:
        run.logger.warn(warning)
    for note in notes:
        run.logger.message(note)


def loop(run: Run) -> None:
    """Train from run.step to the end, a stop or a divergence: step, eval, record, checkpoint."""
    cfg, tc, log, p = run.cfg, run.cfg.train, run.logger, run.parts
    every = Every(cfg.log.stats_every, first=True)
    probe = StabilityProbe(run.model, every, layout=normlab_layout(run.model))
    evals, checkpoints = Every(tc.eval_every, tc.steps), Every(tc.checkpoint_every, tc.steps)
    # Ctrl-C / SIGTERM stop at a step boundary; several processes keep the handler for leave()
    with StopRequest(say=run.d.is_master, keep_on_error=run.d.world_size > 1) as stop:
        stop.saved = run.step if run.how == "resume" else None
        if run.step == 0:  # L0: the val loss before the first step, as every eval computes it
            stop.step(inside=True)
            log.log(0, validate(run))
            stop.step(inside=False)
        for step in range(run.step, tc.steps):
            stop.step(inside=True)  # a stop request inside a long step ends it (StopRequest)
            lr, due = lr_at(step, cfg.optim, cfg.optim.schedule_steps), probe.due(step + 1)
            result = train_step(p, next(run.data.loader), lr, probe if due else NO_PROBE)
            record, run.step = result.record, step + 1
            faults.point("step")
            if result.diverged:  # a non-finite loss or gradient norm: no update made, the run ends
                run.status, run.diverged_at = "diverged", run.step
                log.log(run.step, record)
                loss, norm = record["train/loss"], record["grad/norm"]
                log.message(f"diverged at step {run.step}: loss {loss}, grad norm {norm}")
                return
            if evals.due(run.step):  # on its cadence and at the last step
                record.update(validate(run))
                loss, val = record["train/loss"], record["val/loss"]
                log.message(f"step {run.step}: train loss {loss:.4f}, val loss {val:.4f}")
            log.log(run.step, record)
            faults.point("log")
            stop.step(inside=False)
            # stop at train.stop_at, or on Ctrl-C / SIGTERM on any rank (never at the last step)
            run.planned_stop = run.step == tc.stop_at and run.step < tc.steps
            stop_now = run.step < tc.steps and (
                run.planned_stop or distributed.any_rank(stop.requested, run.d.device)
            )
            if checkpoints.due(run.step) or stop_now:
                save_state(
                    run.dir,
                    cfg,
                    run.d,
                    model=run.model,
                    opt=p.opt,
                    loader=run.data.loader,
                    step=run.step,
                    scaler=p.scaler,
                )
                stop.saved = run.step
            if stop_now:
                run.status = "interrupted"
                why = f"train.stop_at={run.step}" if run.planned_stop else "interrupted"
                again = f"continue with --name {run.dir.name} --resume"
                log.message(f"stopped at step {run.step} ({why}); {again}")
                return


def validate(run: Run) -> dict:
    """The val loss (and bits per byte) of the model now, on the fixed eval set."""
    data, p, d = run.data, run.parts, run.d
    return evaluate(run.model, data.val_tokens, run.cfg, d, p.autocast, p.micro, data.token_bytes)


def finish(run: Run) -> int:
    """Classify a run that ran to its end, sample from one that learned, summarize; the code."""
    state = None
    if run.status == "ok":  # judged on its whole val curve by rank 0, and broadcast
        run.status = decide_status(run.dir, run.cfg, run.d, run.data.meta.get("unigram_entropy"))
        run.diverged_at = run.step if run.status == "diverged" else None  # a NaN final val loss
        if run.cfg.train.sample_tokens and run.status == "ok" and is_sharded(run.model):
            state = full_model_state(run.model)  # unsharded for rank 0: every rank gathers
    faults.point("summary")
    distributed.on_master(summary, run, state)
    return status_code(run.status, run.planned_stop)


def summary(run: Run, state: dict | None) -> None:
    """Rank 0: the sample, summary.json, then the result line, printed last."""
    cfg, tc, log = run.cfg, run.cfg.train, run.logger
    if tc.sample_tokens and run.status == "ok":  # only a run that learned (NaN logits cannot)
        model = run.model
        if state is not None:
            model = Llama(cfg.model).to(run.d.device)
            model.load_state_dict(state)
        text = sample(model, run.data.tok, tc.sample_tokens, tc.seed, run.parts.autocast)
        log.message(f"sample: {text}")
    s = summarize(
        run.dir.records(),
        status=run.status,
        steps_done=run.step,
        total_steps=tc.steps,
        diverged_at=run.diverged_at,
        unigram_entropy=run.data.meta.get("unigram_entropy"),
        spike_window=cfg.log.spike_window,
        spike_k=cfg.log.spike_k,
        wall_time_s=time.time() - run.t_start,
    )
    write_json(run.dir.summary, s)
    log.close(s)  # and its progress bar: the result line below is the last one
    log.message(result_line(run.status, s, run.dir.path))


if __name__ == "__main__":
    sys.exit(main())
