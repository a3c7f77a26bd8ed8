"""Train a Llama from a YAML config; the norm and its placement are one flag away.

    python train.py                                     # configs/train/default.yaml on the embedded corpus
    python train.py --norm layernorm --placement post optim.lr=1e-2 train.steps=300
    python train.py --name my-run --resume              # continue runs/my-run exactly where it stopped
    torchrun --standalone --nproc_per_node 2 train.py ...  # data parallel: gloo on CPU, nccl on GPU

Writes runs/<name>/: config.yaml, meta.json, metrics.jsonl, summary.json, checkpoints/latest.pt.

Exit codes: 0 finished (status ok, plateau, collapsed or unstable; or stopped at train.stop_at, resumable; or
--resume of a run that had already finished), 2 bad input (config, command line, data or checkpoint, or a run too
big for this machine's memory: refused before it starts; nothing is written), 3 diverged (a result: logs and summary
are complete; --resume of it exits 3 again), 4 the run's files could not be written (disk full, read-only: the last
checkpoint is intact), 5 another process of the job died or hung (the others stop within seconds; --resume), 130
interrupted by Ctrl-C / SIGTERM (checkpoint saved; --resume). Under torchrun every process exits with the same code
and one prints the line; torchrun itself then exits 1 for any of them.

--resume is safe on every launch, as a preemptible scheduler relaunches a job: with no run directory or no
checkpoint yet it starts from step 0, with a checkpoint it continues exactly (from previous.pt if latest.pt
is unreadable), with a finished run it exits 0.
"""

from __future__ import annotations

import argparse
import errno
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from data.loader import BatchLoader, eval_batches, load_tokens, read_meta
from data.prepare import prepare
from data.sources import DataError
from data.tokenizer import Tokenizer
from fused import kernel_paths
from model import Llama
from model.blocks import BLOCKS
from model.layers import attention_path
from model.norms import NORMS
from training import distributed, faults, memory
from training.checkpoint import CheckpointError, full_model_state
from training.config import Config, ConfigError, load_config, to_dict
from training.cpu import tune_cpu
from training.evaluate import evaluate
from training.flops import flops_per_token, peak_flops
from training.logger import Logger
from training.metrics import StabilityProbe
from training.optim import build_optimizer, lr_at
from training.parallel import check_layout, data_coords, is_sharded, shard_model
from training.run import (
    StopRequest,
    decide_status,
    open_run,
    resume_state,
    resumed_config,
    save_state,
    start_state,
)
from training.rundir import RunDir, summarize, write_json
from training.step import NO_PROBE, Every, StepParts, autocast_for, no_clip, scaler_for, train_step

EXIT_OK, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_STORAGE, EXIT_INTERRUPTED = 0, 2, 3, 4, 130
EXIT_PEER = distributed.EXIT_PEER  # 5: another process of the job died or hung
REPO = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO / "configs" / "train" / "default.yaml"


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


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["--serve"]:  # `--serve [LABEL]`: LABEL shows in ps
        return serve()
    try:
        cfg, resume, default_name = parse_cli(argv)
        error = None
    except ConfigError as e:
        cfg, resume, default_name, error = None, False, "", str(e)
    if error is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:  # under torchrun even a bad command line joins the job: its ranks then stop together, with one line
        d = distributed.setup(cfg.train.device if cfg else "auto")
    except Exception as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: cannot join the job's other processes: {one_line(e)} (another job on the same port? "
                  f"torchrun --standalone, or a --master_port of its own, keeps jobs apart)", file=sys.stderr)
        return EXIT_PEER
    code, line, together, contact = EXIT_OK, None, True, False
    try:
        if error is not None:
            raise ConfigError(error)
        code = train(cfg, resume, default_name, d)
    except BaseException as e:  # noqa: B036  (Ctrl-C too: every rank must learn of it and leave together)
        code, line = outcome(e, d)
        together, contact = distributed.is_shared(e), distributed.looks_like_lost_contact(e)
    return distributed.leave(d, code, line, together, contact)


def outcome(e: BaseException, d: distributed.Dist) -> tuple[int, str]:
    """(exit code, the one line) of an error that ended the run; a bug's traceback is printed here, by the rank it
    happened on (by rank 0 alone when every rank raised it)."""
    if isinstance(e, (ConfigError, DataError, CheckpointError)):
        return EXIT_BAD_INPUT, f"error: {e}"
    if isinstance(e, KeyboardInterrupt):  # before the training loop (e.g. while preparing data): nothing to save
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(e, MemoryError) or "can't allocate memory" in str(e) or type(e).__name__ == "OutOfMemoryError":
        return EXIT_BAD_INPUT, (f"error: out of memory: {one_line(e)}; the run is too big for this machine: lower "
                                f"train.micro_batch_size or train.seq_len (the last checkpoint is intact)")
    if d.world_size > 1 and distributed.looks_like_lost_contact(e):
        return EXIT_PEER, f"error: lost contact with the job's other processes: {one_line(e)}"
    if isinstance(e, OSError):  # disk full, permissions, a vanished file system: checkpoints are written atomically
        return EXIT_STORAGE, storage_line(e)
    if not distributed.is_shared(e) or d.is_master:
        traceback.print_exception(e)
    return 1, f"error: {one_line(e)} (the traceback above{'' if d.world_size == 1 else f', rank {d.rank}'})"


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def storage_line(e: OSError) -> str:
    """What a failed write means for the run: the last checkpoint is intact; whether --resume can continue now."""
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"error: cannot write the run's files: {e}; make the run directory writable (or use another "
                f"log.out_dir): the last checkpoint is intact, and --resume continues from it once it is")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"error: cannot write the run's files: {e}; the last checkpoint is intact: free some space, then "
                f"--resume continues from it")
    return f"error: cannot write the run's files: {e}; the last checkpoint is intact (--resume continues from it)"


def train(cfg: Config, resume: bool, default_name: str, d: distributed.Dist) -> int:
    t_start, tc, clock = time.time(), cfg.train, Stopwatch()
    try:  # before anything divides by the tensor-group count or shards
        check_layout(tc.parallel, d.world_size, tc.tp_size, cfg.model, tc.seq_len)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    d.data_rank, d.data_world = data_coords(d.rank, d.world_size, tc.parallel, tc.tp_size)
    micro, accum = split_batch(tc, d.data_world)
    cpu = tune_cpu(tc.threads, tc.malloc_tuning) if d.device.type == "cpu" else None
    try:  # too big for this machine: refused before anything large is allocated (every rank checks its own node)
        estimate, error = memory.check(cfg, d.world_size, d.data_world, micro, d.local_world, d.device), None
    except ConfigError as e:
        estimate, error = None, str(e)
    distributed.agree(ConfigError(error) if error else None)
    data = open_data(cfg, d, micro, accum)
    clock.lap("data")
    # which fused kernels run and which paths fall back, built / loaded now rather than inside the first step
    kernels = {**kernel_paths(d.device.type, cfg.model.norm_impl, cfg.model.ops_impl),
               "attention": attention_path(cfg.model)}
    clock.lap("kernels")
    torch.manual_seed(tc.seed)  # the same seed gives the same weights whatever the norm or placement
    model = Llama(cfg.model).to(d.device)
    try:  # DDP wraps; FSDP2 / tensor parallel shard the parameters in place, before the optimizer sees them
        wrapped = shard_model(model, tc.parallel, tc.dtype, tc.tp_size)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    opt = build_optimizer(model, cfg.optim)
    clock.lap("model")
    run, how, lock = open_run(cfg, default_name, resume, d)
    try:  # the run's lock (rank 0's) is released however this ends, not when the garbage collector gets to it
        return run_it(cfg, d, run, how, model, wrapped, opt, data, kernels, cpu, estimate, t_start, clock)
    finally:
        if lock is not None:
            lock.release()


def run_it(cfg: Config, d: distributed.Dist, run: RunDir, how: str, model, wrapped, opt, data, kernels: dict, cpu,
           estimate: memory.Estimate, t_start: float, clock: Stopwatch) -> int:
    """A run whose directory is chosen and locked: finished (nothing to do), or started / resumed and trained."""
    tc = cfg.train
    if how == "finished":
        status = run.status()
        if status == "diverged":  # a result, not a state to continue from: the relaunch says so as the run did
            if d.is_master:
                print(f"run {run.path} diverged at step {(run.read_summary() or {}).get('diverged_at')} (a result: "
                      f"it cannot be trained further); nothing to do", file=sys.stderr)
            return EXIT_DIVERGED
        if d.is_master:
            print(f"run {run.path} already finished ({status}); nothing to do (pass train.steps=N to "
                  f"train further)", file=sys.stderr)
        return EXIT_OK
    scaler = scaler_for(d.device, tc.dtype)
    machine = {"kernels": kernels, "cpu": cpu, "memory": memory.describe(estimate)}
    start_step, notes = resume_state(run, cfg, d, model, opt, scaler, data.loader, machine) if how == "resume" \
        else start_state(run, cfg, d, model, data.meta, machine)
    parts = StepParts(
        model=model, ddp=wrapped, compiled=torch.compile(wrapped) if tc.compile else wrapped, opt=opt,
        micro=data.micro, accum=data.accum, world_size=d.world_size, device=d.device,
        autocast=autocast_for(d.device, tc.dtype), z_loss=tc.z_loss, clip=no_clip(cfg.optim.grad_clip),
        tokens_per_step=tc.batch_size * tc.seq_len, scaler=scaler,
        flops_per_step=flops_per_token(cfg.model, tc.seq_len) * tc.batch_size * tc.seq_len,
        peak_flops=peak_flops(torch.cuda.get_device_name(d.device), tc.dtype) if d.device.type == "cuda" else None)
    logger = Logger(run.path if d.is_master else None, run.name, tc.steps, start_step, cfg.log.wandb,
                    cfg.log.wandb_project, to_dict(cfg))
    try:  # from here on the logger is closed however the run ends, so an error is the last line
        return loop(cfg, d, run, model, opt, data, parts, logger, kernels, notes, start_step, t_start, clock)
    finally:
        logger.close()


def loop(cfg: Config, d: distributed.Dist, run: RunDir, model, opt, data, parts: StepParts, logger: Logger,
         kernels: dict, notes: list[str], start_step: int, t_start: float, clock: Stopwatch) -> int:
    """The training loop, from start_step to the end (or a stop, or a divergence), then finish(); the exit code."""
    tc = cfg.train
    announce(logger, run, cfg, d, model, data, kernels, notes, start_step)
    probe = StabilityProbe(model, Every(cfg.log.stats_every, first=True))
    evals, checkpoints = Every(tc.eval_every, tc.steps), Every(tc.checkpoint_every, tc.steps)
    status, diverged_at, done, planned_stop = "ok", None, start_step, False
    clock.lap("run_dir")
    if start_step == 0:  # L0: the val loss before the first step, the same kind of number as every later eval
        logger.log(0, evaluate(model, data.val_tokens, cfg, d, parts.autocast, data.micro,
                               data.token_bytes.to(d.device)))
    clock.lap("evals")
    stop = StopRequest()  # from here on Ctrl-C stops at a step boundary, leaving a resumable checkpoint
    try:
        for step in range(start_step, tc.steps):
            # one optimizer step at this step's learning rate; the probe observes the steps it is due on
            probed = probe.due(step + 1)
            result = train_step(parts, next(data.loader), lr_at(step, cfg.optim, cfg.optim.schedule_steps),
                                probe if probed else NO_PROBE)
            record, done = result.record, step + 1
            clock.lap("steps_with_metrics" if probed else "steps")
            faults.point("step")
            # a non-finite loss or gradient norm: no update was made; it is logged and the run ends
            if result.diverged:
                status, diverged_at = "diverged", done
                logger.log(done, record)
                logger.message(f"diverged at step {done}: loss {record['train/loss']}, grad norm {record['grad/norm']}")
                break
            # validation, on its cadence and at the last step
            if evals.due(done):
                record.update(evaluate(model, data.val_tokens, cfg, d, parts.autocast, data.micro,
                                       data.token_bytes.to(d.device)))
                logger.message(f"step {done}: train loss {record['train/loss']:.4f}, val loss {record['val/loss']:.4f}")
                clock.lap("evals")
            logger.log(done, record)
            clock.lap("logging")
            faults.point("log")
            # stop at train.stop_at, or on Ctrl-C / SIGTERM on any rank; a request during the last step lets it end
            planned_stop = done == tc.stop_at and done < tc.steps
            stop_now = (planned_stop or distributed.any_rank(stop.requested, d.device)) and done < tc.steps
            # a checkpoint on its cadence, at the last step and before stopping
            if checkpoints.due(done) or stop_now:
                save_state(run, cfg, d, model, opt, data.loader, done, parts.scaler)
                clock.lap("checkpoints")
            if stop_now:
                status = "interrupted"
                why = f"train.stop_at={done}" if planned_stop else "interrupted"
                logger.message(f"stopped at step {done} ({why}); continue with --name {run.name} --resume")
                break
    except KeyboardInterrupt:  # a second Ctrl-C: the last checkpoint stays the resumable state
        status = "interrupted"
    except BaseException:
        # under torchrun the handler (it only takes note) stays until leave() ignores both signals: torchrun sends
        # SIGTERM to the others once one process exits, and a survivor of a failed collective must not be killed
        # by it before it reads why and reports (measured: rank 0 exited -15 without a line)
        if d.world_size == 1:
            stop.restore()
        raise
    stop.restore()
    status, diverged_at = finish(run, cfg, d, model, data, logger, status, diverged_at, done, t_start, clock)
    if status == "diverged":
        return EXIT_DIVERGED
    return EXIT_INTERRUPTED if status == "interrupted" and not planned_stop else EXIT_OK


class Stopwatch:
    """Wall seconds per phase of a run, for summary.json's phases_s (scripts/bench_study.py reads them)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap to `phase`."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}


@dataclass
class Data:
    prepared: Path
    meta: dict
    loader: BatchLoader
    val_tokens: object
    micro: int  # sequences per forward pass and process
    accum: int  # micro-batches per optimizer step
    token_bytes: torch.Tensor  # bytes of text each token id stands for (val/bpb)


def split_batch(tc, data_world: int) -> tuple[int, int]:
    """(sequences per forward pass and process, micro-batches per optimizer step): train.batch_size split into
    data_world shares, each into micro-batches of train.micro_batch_size (0: the whole share)."""
    per_rank = tc.batch_size // data_world
    if tc.batch_size % data_world or per_rank == 0:
        raise ConfigError(f"train.batch_size={tc.batch_size} must split evenly into the {data_world} data-parallel "
                          f"shares of this job (a multiple of {data_world})")
    micro = tc.micro_batch_size or per_rank
    if per_rank % micro:
        raise ConfigError(f"train.micro_batch_size={micro} must divide each data-parallel share of "
                          f"train.batch_size={tc.batch_size} ({per_rank} sequences on each of {data_world} shares)")
    return micro, per_rank // micro


def open_data(cfg: Config, d: distributed.Dist, micro: int, accum: int) -> Data:
    """The prepared dataset (built once, cached; concurrent processes wait), its loader and the val tokens."""
    tc = cfg.train
    prepared = prepare(**vars(cfg.data), verbose=d.is_master)  # DataConfig's fields are prepare()'s arguments
    loader = BatchLoader(load_tokens(prepared, "train"), tc.seq_len, tc.batch_size, tc.seed, d.data_rank,
                         d.data_world)
    val_tokens = load_tokens(prepared, "val")
    eval_batches(val_tokens, tc.seq_len, micro, tc.eval_tokens)  # too few val tokens: fail before any output
    token_bytes = torch.from_numpy(Tokenizer(prepared / "tokenizer.model").token_bytes())
    return Data(prepared, read_meta(prepared), loader, val_tokens, micro, accum, token_bytes)


def announce(logger: Logger, run: RunDir, cfg: Config, d: distributed.Dist, model, data: Data, kernels: dict,
             notes: list[str], start_step: int) -> None:
    """The run's first lines: what trains where, which fast paths fall back, what a resume changed."""
    if not d.is_master:
        return
    tc = cfg.train
    spread = f"{d.data_world} data shares" + (f" x tensor parallel over {d.world_size // d.data_world}"
                                              if d.world_size > d.data_world else "")
    logger.message(f"run {run.path} | {model.num_params():,} parameters | {cfg.model.norm} {cfg.model.placement}"
                   f" | {tc.batch_size}x{tc.seq_len} tokens/step ({data.accum} micro-batches x {spread}) | "
                   f"{d.device} {tc.dtype}" + (f" | resumed at step {start_step}" if start_step else ""))
    fallbacks = [f"{op}: {path}" for op, path in kernels.items() if op != "build" and path.startswith("reference (")]
    for note in (["fast paths that fall back: " + "; ".join(fallbacks)] if fallbacks else []) + notes:
        logger.message(note)


def finish(run: RunDir, cfg: Config, d: distributed.Dist, model, data: Data, logger: Logger, status: str,
           diverged_at: int | None, done: int, t_start: float, clock: Stopwatch) -> tuple[str, int | None]:
    """Classify a run that ran to its end on its whole val curve, sample from one that learned, write
    summary.json; (status, diverged_at). Rank 0 samples and writes; the others learn how that went."""
    tc = cfg.train
    state = None
    if status == "ok":
        status = decide_status(run, cfg, d, data.meta.get("unigram_entropy"))
        diverged_at = done if status == "diverged" else None  # a non-finite final val loss
        if tc.sample_tokens and status == "ok" and is_sharded(model):
            state = full_model_state(model)  # rank 0 samples from an unsharded copy; gathering it is every rank's
    faults.point("summary")

    def wrap_up() -> None:
        if tc.sample_tokens and status == "ok":  # only a run that learned (NaN logits cannot)
            sampler = model
            if state is not None:
                sampler = Llama(cfg.model).to(d.device)
                sampler.load_state_dict(state)
            logger.message("sample: " + sample(sampler, data.prepared, tc, d.device, autocast_for(d.device, tc.dtype)))
        clock.lap("finish")
        summary = summarize(run.records(), status, done, tc.steps, diverged_at, data.meta.get("unigram_entropy"),
                            cfg.log.spike_window, cfg.log.spike_k, time.time() - t_start)
        summary["phases_s"] = clock.rounded()  # where this process's wall time went (not a result)
        write_json(run.summary, summary)
        final, dead = summary["final_val_loss"], summary["dead_gradients_at"]
        why = "" if dead is None else f" dead gradients (every gradient below the final norm 0 from step {dead});"
        logger.message(f"{status}:{why} final val loss {'-' if final is None else f'{final:.4f}'} (unigram entropy "
                       f"{summary['unigram_entropy']:.3f}), {summary['tokens_per_s'] or 0:,.0f} tokens/s -> {run.path}")
        logger.close(summary)

    distributed.on_master(wrap_up)
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


def serve() -> int:
    """`train.py --serve [LABEL]`: run many runs in this one process, one after another (a study's persistent workers,
    study/runner.py), so that Python, torch, the kernels and these imports are paid once, not once per run.

    Each stdin line is a request {"argv": [train.py's arguments], "log": path}; the run's output (stdout and
    stderr, at the file-descriptor level, as a process of its own would write it) is appended to the log, and one
    line {"exit_code": N} answers on stdout. LABEL is free text for `ps` (study workers give their runs folder). A
    run computes what `python train.py ARGV` computes: everything a run
    depends on (seeds, threads, its files) is set by the run itself. A run that raises what train.py does not
    handle (exit 1: main prints its traceback), or is interrupted, ends the worker after its answer (its state is
    unknown); the runner starts a new one."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed between runs goes to stderr, never into the answers
    try:
        for line in sys.stdin:
            request = json.loads(line)
            code, fatal = run_logged(request["argv"], request["log"])
            answers.write(json.dumps({"exit_code": code}) + "\n")
            if fatal or code in (1, EXIT_INTERRUPTED):  # a bug (state unknown), or the study is stopping
                return code
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group, an idle worker too
        return EXIT_INTERRUPTED
    return EXIT_OK


def run_logged(argv: list[str], log: str) -> tuple[int, bool]:
    """main(argv) with file descriptors 1 and 2 sent to `log`; (exit code, whether the worker must end)."""
    code, fatal, saved = 1, False, [os.dup(1), os.dup(2)]
    faults.reset()  # fault-injection counts are per run, as in a process of its own
    with open(log, "a") as f:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors (exit 2), as a process would end
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        except KeyboardInterrupt:
            code, fatal = EXIT_INTERRUPTED, True
        except BaseException:  # noqa: BLE001  a crash: the traceback a process would print, then a fresh worker
            traceback.print_exc()
            code, fatal = 1, True
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, copy in ((1, saved[0]), (2, saved[1])):
                os.dup2(copy, fd)
                os.close(copy)
    gc.collect()  # the run's model, optimizer and lock go now, not at some later run's allocation
    return code, fatal


if __name__ == "__main__":
    sys.exit(main())
