"""Atomic save / load of the full training state, for exact resume: one file (latest.pt,
previous.pt) in one process or under DDP; under FSDP2 / tensor parallelism a
torch.distributed.checkpoint (DCP) directory (latest.dcp, previous.dcp) that every rank writes its
shards into, and that a load reshards to whatever world size reads it (saved on 2 ranks, resumed on
1, or the reverse). One routine finds a run's newest readable checkpoint of either kind, ordered by
step, for resuming (training/run.py) and for load_run (a run's model, for sampling and export)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from training import distributed, faults
from training.parallel import is_sharded
from training.rundir import RunDir, fsync_dir, storage_error


class CheckpointError(ValueError):
    """An unreadable or incompatible checkpoint: the message is the one line the user sees."""


def previous_path(path: Path) -> Path:
    return path.with_name(f"previous{path.suffix}")


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write `state` so that `path` always holds a complete checkpoint, and the one before it stays
    as previous.pt until the new one is durable: temp file, fsync, latest -> previous, temp ->
    latest, fsync dir."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed mid-write
        if not stale.name.endswith(f"-{os.getpid()}"):
            stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_durably(state, tmp)
        faults.point("checkpoint")
        if path.exists():
            os.replace(path, previous_path(path))
            faults.point("checkpoint_swap")
        # atomic on POSIX: readers see the old or the new file, never half of one
        os.replace(tmp, path)
        fsync_dir(path.parent)  # make the renames themselves durable
    finally:
        tmp.unlink(missing_ok=True)


def save_durably(obj, path: Path) -> None:
    """torch.save to `path`, flushed and fsynced (on disk before anything is renamed onto it)."""
    with open(path, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as e:  # a full disk: torch's RuntimeError around Python's OSError
            raise storage_error(e) or e from None
        f.flush()
        os.fsync(f.fileno())


def load_checkpoint(path: str | Path) -> dict:
    """The state saved at `path` (tensors on CPU), or CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"cannot read checkpoint {path}: {str(e).strip().splitlines()[0][:200]}"
        ) from None


def rng_state() -> dict:
    """The CPU generator and, on a GPU machine, the current device's: a process drives one device,
    and a checkpoint must resume where fewer (or other) GPUs are visible."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore rng_state(); CheckpointError (one line) when it does not fit this machine."""
    try:
        torch.set_rng_state(state["torch"])
        cuda = state.get("cuda")
        if cuda is not None and torch.cuda.is_available():
            if isinstance(cuda, (list, tuple)):  # older checkpoints: one state per visible device
                device = torch.cuda.current_device()
                if device >= len(cuda):
                    raise CheckpointError(
                        f"the checkpoint holds CUDA RNG states for {len(cuda)} devices; this "
                        f"process drives device {device}"
                    )
                cuda = cuda[device]
            torch.cuda.set_rng_state(cuda)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(
            f"cannot restore the RNG state: {(str(e).strip().splitlines() or [repr(e)])[0][:200]}"
        ) from None


# sharded runs (fsdp, tp): DCP directories, every rank writing and reading its own shards


def dcp_paths(checkpoint: Path) -> tuple[Path, Path]:
    """(latest, previous) DCP checkpoint directories beside a run's latest.pt."""
    return checkpoint.with_name("latest.dcp"), checkpoint.with_name("previous.dcp")


def save_sharded_checkpoint(
    checkpoint: Path, model: nn.Module, opt: torch.optim.Optimizer, extra: dict
) -> None:
    """A sharded run's checkpoint: a DCP directory written in full under a temporary name, then
    (rank 0) latest.dcp -> previous.dcp and the new one -> latest.dcp, as latest.pt / previous.pt
    rotate, the renames fsynced. A failure on any rank (a full disk) is an OSError on every rank,
    the previous checkpoints intact; rank 0's parts (the temporary directory, the renames) reach
    every rank as their outcome, never as a barrier."""
    import shutil

    latest, previous = dcp_paths(checkpoint)
    tmp = checkpoint.with_name(".latest.dcp.tmp")

    def fresh() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)

    distributed.on_master(fresh)
    save_sharded(tmp, model, opt, extra)  # every rank's shards are written, or every rank raised
    faults.point("checkpoint")

    def rotate() -> None:
        if latest.exists():
            shutil.rmtree(previous, ignore_errors=True)
            os.replace(latest, previous)
            faults.point("checkpoint_swap")
        os.replace(tmp, latest)
        fsync_dir(latest.parent)

    distributed.on_master(rotate)


def _dcp_failure(e: BaseException) -> BaseException:
    """The first rank's underlying exception of a DCP CheckpointException (a BaseException that
    carries them)."""
    failures = getattr(e, "failures", None) or {}
    first = next(iter(failures.values()), None)
    return first[0] if isinstance(first, tuple) else (first or e)


def _one_line(e: BaseException) -> str:
    """An exception as one short line: its first sentence (torch's zip reader adds four of advice);
    an empty message says what the type means (EOFError: the file ends early)."""
    lines = str(e).strip().splitlines()
    empty = {EOFError: "the file ends early (truncated?)", KeyError: "an entry is missing"}
    reason = (
        lines[0] if lines else next((v for k, v in empty.items() if isinstance(e, k)), "no message")
    )
    if len(reason) > 120 and ". " in reason:
        reason = reason.split(". ")[0]
    return f"{type(e).__name__}: {reason}"[:300]


@dataclass(frozen=True)
class Candidate:
    """A checkpoint of a run: latest.pt, previous.pt (one file), latest.dcp or previous.dcp (a
    sharded run's directory), and the step it holds."""

    path: Path
    step: int

    @property
    def sharded(self) -> bool:
        return self.path.suffix == ".dcp"


def candidates(checkpoint: Path) -> tuple[list[Candidate], list[str]]:
    """Every checkpoint beside a run's latest.pt of either kind, newest step first (a newer write
    breaks a tie), and why the others cannot be read. The step is read cheaply: a .pt file's pickle
    with its tensors memory-mapped, not read; a DCP directory's extra.pt (written last: without it
    the directory is incomplete)."""
    found, errors = [], []
    for path in (checkpoint, previous_path(checkpoint)):
        if path.is_file():
            try:
                step = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"]
                found.append((step, path.stat().st_mtime, Candidate(path, int(step))))
            except Exception as e:
                errors.append(f"cannot read checkpoint {path}: {_one_line(e)}")
    for path in dcp_paths(checkpoint):
        if path.is_dir():
            try:
                step = torch.load(path / "extra.pt", weights_only=False)["step"]
                found.append(
                    (step, (path / "extra.pt").stat().st_mtime, Candidate(path, int(step)))
                )
            except Exception as e:
                why = (
                    "no extra.pt (incomplete)" if not (path / "extra.pt").exists() else _one_line(e)
                )
                errors.append(f"sharded checkpoint {path} cannot be read: {why}")
    return [c for _, _, c in sorted(found, key=lambda x: x[:2], reverse=True)], errors


def load_newest(
    checkpoint: Path, load: Callable[[Candidate], object]
) -> tuple[object, Candidate, list[str]]:
    """The newest checkpoint `load` can read, whatever its kind: (what load returned, which one, why
    newer ones were skipped). Under torchrun every rank tries the same checkpoints in the same order
    (rank 0 lists them) and they agree on each outcome, as a DCP load is a collective.
    CheckpointError naming every failure when none loads."""
    listed = distributed.on_master(candidates, Path(checkpoint))
    found, errors = listed
    for c in found:
        try:
            with _quiet_dcp():
                result, error = load(c), None
        except CheckpointError as e:
            # the message only: no traceback (and its frames) kept
            result, error = (None, CheckpointError(str(e)))
        error = distributed.first_error(error)
        if error is None:
            return result, c, errors
        errors.append(str(error))
    if not errors:
        raise CheckpointError(f"no checkpoint in {Path(checkpoint).parent}")
    raise CheckpointError("; ".join(errors))


def skipped(errors: list[str], c: Candidate) -> str | None:
    """The line that says a resume fell back past unreadable checkpoints, or None."""
    return f"{'; '.join(errors)}: resuming from {c.path.name} (step {c.step})" if errors else None


@contextmanager
def _quiet_dcp():
    """DCP logs every failed read to the root logger with its traceback (~80 lines for a missing
    .metadata) before raising: the failure is one CheckpointError line (and a fallback) here, so
    those records are dropped."""

    def keep(record: logging.LogRecord) -> bool:
        return "distributed/checkpoint" not in record.pathname.replace(os.sep, "/")

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def load_full_state(
    model: nn.Module, opt: torch.optim.Optimizer, model_state: dict, opt_state: dict
) -> None:
    """Load a full (unsharded) model and optimizer state, as a .pt checkpoint holds it, into this
    model and optimizer: directly in one process or DDP; onto a sharded model through torch's
    distributed state-dict API, which takes each rank's shard of every tensor (plain load_state_dict
    would accept full-size state for sharded parameters). Shapes that do not fit raise."""
    if not is_sharded(model):
        model.load_state_dict(model_state)
        opt.load_state_dict(opt_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    # optimizer.state_dict() names parameters by their index in the param groups; the distributed
    # API by name
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in opt.param_groups for p in group["params"]]
    by_name = {
        "state": {order[i]: v for i, v in opt_state["state"].items()},
        "param_groups": [
            {**g, "params": [order[i] for i in g["params"]]} for g in opt_state["param_groups"]
        ],
    }
    set_state_dict(
        model,
        opt,
        model_state_dict=model_state,
        optim_state_dict=by_name,
        options=StateDictOptions(full_state_dict=True),
    )


@contextmanager
def _readable(path: Path):
    """A DCP checkpoint that cannot be read (damaged, foreign, missing pieces) is bad input: one
    CheckpointError line. DCP raises CheckpointException, a BaseException, that `except Exception`
    would let through."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        raise CheckpointError(
            f"sharded checkpoint {path} cannot be read: {_one_line(_dcp_failure(e))}"
        ) from None
    except Exception as e:
        raise CheckpointError(f"sharded checkpoint {path} cannot be read: {_one_line(e)}") from None


def load_sharded_weights(path: Path, model: nn.Module) -> None:
    """The model weights of a DCP checkpoint (any world size wrote it) into an unsharded model in
    one process, for export and sampling; CheckpointError (one line) when it cannot be read or does
    not fit."""
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    with _readable(path), _single_process_ok():
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["model"])


def full_model_state(model: nn.Module) -> dict:
    """The whole model's state, unsharded, on rank 0's CPU ({} on the other ranks). A collective:
    every rank calls it. For work that should not be a collective per step (sampling token by token:
    under tensor parallelism a prompt's length rarely splits evenly over the sequence-parallel
    ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


@contextmanager
def _single_process_ok():
    """DCP warns that it 'assumes' a single process when there is no process group: here that is the
    intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_sharded(path: Path, model: nn.Module, opt: torch.optim.Optimizer, extra: dict) -> None:
    """A DCP checkpoint directory: model and optimizer state as each rank holds it, plus `extra`
    (step, loader, RNG...; the same on every rank, written once)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, opt_state = get_state_dict(model, opt)
    try:
        with _single_process_ok():
            dcp.save(
                {"model": model_state, "optimizer": opt_state},
                checkpoint_id=str(path),
                no_dist=not dist.is_initialized(),
            )
    # a BaseException, raised on every rank (DCP gathers the failures): one line
    except CheckpointException as e:
        error = OSError(f"sharded checkpoint {path}: {_one_line(_dcp_failure(e))}")
        raise (distributed.shared(error) if dist.is_initialized() else error) from None

    def write_extra() -> None:  # written last: a directory with extra.pt is a complete checkpoint
        save_durably(extra, Path(path) / ".extra.pt.tmp")
        os.replace(Path(path) / ".extra.pt.tmp", Path(path) / "extra.pt")
        fsync_dir(Path(path))

    distributed.on_master(write_extra)


def load_sharded(path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Load a DCP checkpoint into this model and optimizer, whatever world size wrote it (DCP
    reshards); the `extra` dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "optimizer": opt_state}
    with _readable(path), _single_process_ok():
        # one process: no collectives
        dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
        extra = torch.load(Path(path) / "extra.pt", weights_only=False)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return extra


def load_run(run_dir: Path):
    """(model, prepared data directory) of a run: its config.yaml's model with the weights of its
    newest readable checkpoint of either kind (load_newest), in eval mode; ConfigError /
    CheckpointError (one line) when run_dir is not a usable run."""
    from data.prepare import prepare
    from model import Llama
    from training.config import ConfigError, load_config

    run = RunDir(Path(run_dir))
    if not run.config.is_file():
        raise ConfigError(f"{run.path} is not a run directory (no config.yaml)")
    cfg = load_config(run.config)
    # DataConfig's fields are prepare()'s arguments
    prepared = prepare(**vars(cfg.data), verbose=False)
    model = Llama(cfg.model)

    def weights(c: Candidate) -> None:
        if c.sharded:
            return load_sharded_weights(c.path, model)
        try:
            model.load_state_dict(load_checkpoint(c.path)["model"])
        except (RuntimeError, KeyError) as e:
            raise CheckpointError(
                f"checkpoint {c.path} does not fit {run.config}: "
                f"{str(e).strip().splitlines()[0][:200]}"
            ) from None

    load_newest(run.checkpoint, weights)
    return model.eval(), prepared
