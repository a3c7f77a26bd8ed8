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
    """The command line, built without torch: --help answers at once."""
    from model.args import NORM_NAMES, PLACEMENT_NAMES

    head, _, tail = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(
        description=head, epilog=tail, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help=f"YAML config (default: {DEFAULT_CONFIG.relative_to(REPO)})")
    p.add_argument("--norm", help=f"model.norm: {', '.join(NORM_NAMES)}")
    p.add_argument("--placement", help=f"model.placement: {', '.join(PLACEMENT_NAMES)}")
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

from data.loader import BatchLoader, eval_batches, load_tokens, read_meta
from data.prepare import prepare as prepare_data
from data.sources import DataError
from data.tokenizer import Tokenizer
from fused import fallen_back, kernel_available, kernel_paths
from model import Llama
from model.layers import attention_path
from training import distributed, faults, memory
from training.checkpoint import full_model_state
from training.config import Config, ConfigError, resumed_config, to_dict
from training.config import validate as validate_config
from training.cpu import tune_cpu
from training.evaluate import evaluate, sample
from training.flops import flops_per_token, peak_flops
from training.logger import Logger
from training.metrics import StabilityProbe
from training.optim import lr_at
from training.outcome import cannot_join, finished, leave, outcome, result_line, status_code
from training.parallel import check_layout, data_coords, is_sharded, shard_model, split_batch
from training.run import StopRequest, decide_status, open_run, resume_state, save_state, start_state
from training.rundir import RunDir, summarize, write_json
from training.step import NO_PROBE, Every, StepParts, step_parts, train_step


def on_rank_0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def parse_cli(argv: list[str] | None) -> tuple[Config, bool, str]:
    """(config, resume, default run name): defaults < YAML < flags and key=value."""
    a, config, flags, merged = read_cli(argv)
    warmup = merged.optim.warmup_steps
    cfg = validate_config(merged)
    saved = Path(cfg.log.out_dir) / (cfg.log.name or "") / "config.yaml"
    if a.resume:
        if not cfg.log.name:
            raise ConfigError(
                "--resume needs --name (the run to continue, or to start if it does not exist yet)"
            )
    if a.resume and saved.is_file():  # the checkpoint holds a model and optimizer built from it
        cfg = resumed_config(saved, cfg if a.config else None, a.overrides, flags)
    elif cfg.optim.warmup_steps != warmup and on_rank_0():  # a new run's shortened warmup
        print(
            f"note: optim.warmup_steps={warmup} is not shorter than the schedule's "
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
    except BaseException as e:  # noqa: B036  (Ctrl-C before the loop too: nothing to save)
        (code, line), error = outcome(e, d), e
    return leave(d, code, line, error)


def prepare(cfg: Config) -> Path:
    """The prepared data folder of cfg's source, and the fused kernels it names, built once (what a
    run does first; a driver calls it before starting runs side by side). A bad source is a
    ConfigError, as in a run."""
    try:
        prepared = prepare_data(**vars(cfg.data), verbose=False)
    except DataError as e:
        raise ConfigError(str(e)) from None
    if "fused" in (cfg.model.norm_impl, cfg.model.ops_impl):
        kernel_available()
    return prepared


def describe(cfg: Config, device: str = "", dtype: str = "") -> dict:
    """What a run of cfg is, without building it: parameters, non-embedding ones (Kaplan et al.
    2020's N), training FLOPs per token, and the named GPU's dense peak FLOP/s in `dtype` (default
    cfg's; None for an unknown device)."""
    with torch.device("meta"):
        model = Llama(cfg.model)
    return {
        "parameters": model.num_params(),
        "non_embedding_parameters": model.num_params(non_embedding=True),
        "flops_per_token": flops_per_token(cfg.model, cfg.train.seq_len),
        "peak_flops": peak_flops(device, dtype or cfg.train.dtype) if device else None,
    }


@dataclass
class Data:
    tok: Tokenizer
    meta: dict
    loader: BatchLoader
    val_tokens: object
    token_bytes: torch.Tensor  # bytes of text each token id stands for (val/bpb)
    micro: int  # sequences per forward pass and process
    accum: int  # micro-batches per optimizer step


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


def inputs(cfg: Config, d: distributed.Dist) -> tuple[Data, dict]:
    """The job's layout, the batch split, this node's memory, the data, the kernels."""
    tc = cfg.train
    # before anything divides by the tensor-group count or shards
    check_layout(tc.parallel, d.world_size, tc.tp_size, cfg.model, tc.seq_len)
    d.data_rank, d.data_world = data_coords(d.rank, d.world_size, tc.parallel, tc.tp_size)
    micro, accum = split_batch(tc, d.data_world)
    cpu = tune_cpu(tc.threads, tc.malloc_tuning) if d.device.type == "cpu" else None
    # too big for this machine: refused before anything large is allocated (each rank its node)
    estimate = memory.check(cfg, d.world_size, d.data_world, micro, d.local_world, d.device)
    prepared = prepare_data(**vars(cfg.data), verbose=d.is_master)  # built once, cached
    shard = (d.data_rank, d.data_world)
    loader = BatchLoader(load_tokens(prepared, "train"), tc.seq_len, tc.batch_size, tc.seed, *shard)
    val_tokens = load_tokens(prepared, "val")
    eval_batches(val_tokens, tc.seq_len, micro, tc.eval_tokens)  # too few val tokens: fail now
    tok = Tokenizer(prepared / "tokenizer.model")
    # which fused kernels run and which paths fall back, loaded now rather than in the first step
    kernels = kernel_paths(d.device.type, cfg.model.norm_impl, cfg.model.ops_impl)
    kernels["attention"] = attention_path(cfg.model)
    token_bytes = torch.from_numpy(tok.token_bytes()).to(d.device)
    data = Data(tok, read_meta(prepared), loader, val_tokens, token_bytes, micro, accum)
    return data, {"kernels": kernels, "cpu": cpu, "memory": memory.describe(estimate)}


def start(run: Run) -> None:
    """Restore the newest checkpoint or write a new run's files; the logger; the first lines."""
    cfg, d, p, data, tc = run.cfg, run.d, run.parts, run.data, run.cfg.train
    warnings = []
    if run.how == "resume":  # a skipped (damaged) checkpoint is a warning
        state = (run.model, p.opt, p.scaler, data.loader, run.machine)
        run.step, warnings = resume_state(run.dir, cfg, d, *state)
        notes = []
    else:
        run.step, notes = start_state(run.dir, cfg, d, run.model, data.meta, run.machine)
    where, wandb = run.dir.path if d.is_master else None, (cfg.log.wandb, cfg.log.wandb_project)
    run.logger = Logger(where, run.dir.name, tc.steps, run.step, *wandb, to_dict(cfg))
    tp = d.world_size // d.data_world  # the batch's split, said only where there is one
    split = [(p.accum, "micro-batches"), (d.data_world, "data shares"), (tp, "tensor parallel")]
    split = " x ".join(f"{n} {what}" for n, what in split if n > 1)
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
    probe = StabilityProbe(run.model, Every(cfg.log.stats_every, first=True))
    evals, checkpoints = Every(tc.eval_every, tc.steps), Every(tc.checkpoint_every, tc.steps)
    # Ctrl-C / SIGTERM stop at a step boundary; several processes keep the handler for leave()
    with StopRequest(say=run.d.is_master, keep_on_error=run.d.world_size > 1) as stop:
        stop.saved = run.step if run.how == "resume" else None
        if run.step == 0:  # L0: the val loss before the first step, as every eval computes it
            log.log(0, validate(run))
        for step in range(run.step, tc.steps):
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
            # stop at train.stop_at, or on Ctrl-C / SIGTERM on any rank (never at the last step)
            run.planned_stop = run.step == tc.stop_at and run.step < tc.steps
            stop_now = run.step < tc.steps and (
                run.planned_stop or distributed.any_rank(stop.requested, run.d.device)
            )
            if checkpoints.due(run.step) or stop_now:
                state = (run.model, p.opt, run.data.loader, run.step, p.scaler)
                save_state(run.dir, cfg, run.d, *state)
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
    ended = (run.status, run.step, tc.steps, run.diverged_at, run.data.meta.get("unigram_entropy"))
    spikes, wall = (cfg.log.spike_window, cfg.log.spike_k), time.time() - run.t_start
    s = summarize(run.dir.records(), *ended, *spikes, wall)
    write_json(run.dir.summary, s)
    log.close(s)  # and its progress bar: the result line below is the last one
    log.message(result_line(run.status, s, run.dir.path))


if __name__ == "__main__":
    sys.exit(main())
