"""torchrun setup, the few collectives train.py needs (no-ops in one process), and how a process
leaves.

Errors under torchrun are of two kinds. Rank 0's work that the others wait for (its writes and reads
of the run directory: on_master) and checks whose answer may differ by rank (agree) end as the same
error on every rank (`shared`): rank 0 prints the line and every rank exits with its code. Any other
error is one rank's own: that rank prints its line and leaves at once, and torchrun's agent stops
the others (a peer whose collective fails because of it says nothing and exits 5). torchrun's report
names the rank that failed first, with its exit code, and a rank that died without a word (kill -9,
the OOM killer)."""

from __future__ import annotations

import copy
import os
import pickle
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    data_rank: int = 0  # the share of each batch this process reads: its rank, or (tensor parallel)
    data_world: int = 1  # its tensor group's index; the number of shares
    local_world: int = 1  # processes of the job on this machine (they share its memory)

    @property
    def is_master(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto") -> Dist:
    """Read torchrun's environment; with WORLD_SIZE > 1 join the process group (nccl / gloo)."""
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        use_tf32()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return Dist(rank, local_rank, world, dev, rank, world, local_world)


def use_tf32() -> None:
    """float32 matmuls and convolutions on TF32 tensor cores; recorded in meta.json (`tf32`).

    Through the API torch.get_float32_matmul_precision() reads (inductor's max-autotune calls it):
    setting the per-backend fp32_precision instead makes that call raise ('mix of the legacy and new
    APIs')."""
    torch.set_float32_matmul_precision("high")  # TF32 matmuls
    torch.backends.cudnn.allow_tf32 = True  # TF32 convolutions


def all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Sum (or op) of t over processes, in place; identity in a single process."""
    if dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t


def any_rank(flag: bool, device: torch.device) -> bool:
    """True if flag is set on any process (so that all of them stop at the same step)."""
    if not dist.is_initialized():
        return flag
    return bool(all_reduce(torch.tensor([float(flag)], device=device), dist.ReduceOp.MAX).item())


def broadcast_object(obj, src: int = 0):
    """The object of process `src`, on every process."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# -- errors every rank raises together -------------------------------------------------------------


def shared(e: BaseException) -> BaseException:
    """Mark e as raised on every rank at the same point: they leave together, rank 0 says it."""
    e.shared_by_every_rank = True
    return e


def is_shared(e: BaseException) -> bool:
    return getattr(e, "shared_by_every_rank", False)


def _portable(e: BaseException) -> BaseException:
    """e itself when it pickles (to be raised on the other ranks), else a RuntimeError saying it."""
    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def on_master(fn, *args, **kwargs):
    """fn(*args, **kwargs) run by rank 0 alone, its outcome on every rank: its result, or its error
    (shared).

    For rank 0's work that the others would otherwise wait for at their next collective without
    knowing it failed (its writes, its reads of the run directory)."""
    if not dist.is_initialized():
        return fn(*args, **kwargs)
    outcome = None
    if dist.get_rank() == 0:
        try:
            outcome = ("ok", fn(*args, **kwargs))
        except Exception as e:
            error = e
            outcome = ("error", _portable(e))
    kind, value = broadcast_object(outcome)
    if kind == "error":
        try:  # rank 0 raises its own error (its traceback is the useful one), the others a copy
            raise shared(error if dist.get_rank() == 0 else value)
        finally:
            error = value = None  # no frame of this call keeps the exception it raised alive
    return value


def first_error(error: Exception | None) -> Exception | None:
    """The first rank's error (this rank's own object when it is that rank), or None."""
    if not dist.is_initialized():
        return error
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, None if error is None else _portable(error))
    first = next((r for r, e in enumerate(errors) if e is not None), None)
    return None if first is None else error if first == dist.get_rank() else errors[first]


def agree(error: Exception | None) -> None:
    """Raise on every rank the first rank's error (shared), if any rank has one: for checks whose
    answer may differ by rank (what a node's file system holds, how much memory it has)."""
    first = first_error(error)
    if first is not None:
        raise shared(first if first is error else copy.copy(first))


def looks_like_lost_contact(e: BaseException) -> bool:
    """A collective that failed because a peer is gone (gloo: 'Connection closed by peer'), as
    itself or inside another error's message (DCP wraps it)."""
    text = str(e).lower()
    return isinstance(e, getattr(dist, "DistError", ())) or any(
        s in text
        for s in (
            "connection closed by peer",
            "connection reset by peer",
            "gloo/transport",
            "nccl error",
            "broken pipe",
        )
    )


# -- leaving ---------------------------------------------------------------------------------------


def exit_now(code: int) -> None:
    """Flush stdout and stderr and leave at once (os._exit): under torchrun, gloo's threads are
    never torn down at interpreter exit, which could abort a rank ('terminate called without an
    active exception')."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_job(code: int = 0) -> None:
    """The end of a script under torchrun (tests/dist/): every rank at a barrier, then exit_now."""
    if dist.is_initialized():
        dist.barrier()
    exit_now(code)
