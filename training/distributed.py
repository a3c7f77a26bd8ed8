"""torchrun / DDP setup and teardown and the few collectives train.py needs (no-ops in one process)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    data_rank: int = 0  # which share of each batch this process reads: its rank, or under tensor parallelism
    data_world: int = 1  # its tensor group's index (the ranks of a group read the same data)

    @property
    def is_master(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto") -> Dist:
    """Read torchrun's environment; with WORLD_SIZE > 1 join the process group (nccl on GPU, gloo on CPU)."""
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        use_tf32()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Dist(rank, local_rank, world, dev, rank, world)


def use_tf32() -> None:
    """float32 matmuls and convolutions on TF32 tensor cores (10-bit mantissa inputs, float32 accumulation):
    what a float32 run on an Ampere+ GPU should use; recorded in meta.json (`tf32`). Through the API that
    torch.get_float32_matmul_precision() reads (inductor's max-autotune calls it): setting the per-backend
    fp32_precision instead makes that call raise ('mix of the legacy and new APIs')."""
    torch.set_float32_matmul_precision("high")  # TF32 matmuls
    torch.backends.cudnn.allow_tf32 = True  # TF32 convolutions


def teardown() -> None:
    """Leave the process group together: a rank that destroys its group while another still works (rank 0 writes
    the summary) could abort at exit in gloo ('terminate called without an active exception', measured)."""
    if dist.is_initialized():
        try:
            if dist.get_backend() == "gloo":  # bounded: a rank that died must not hang the others
                dist.monitored_barrier(timeout=timedelta(seconds=120))
            else:
                dist.barrier()
        except Exception:  # a peer is gone: nothing left to wait for
            pass
        dist.destroy_process_group()


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
