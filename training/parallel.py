"""How the model is spread over processes, on PyTorch's own engine (torch.distributed), launched by torchrun:

- `ddp`: every rank holds the whole model and optimizer state; gradients are all-reduced (DistributedDataParallel).
- `fsdp`: FSDP2 (`fully_shard`) per block and at the root over a 1-D mesh: parameters, gradients and AdamW
  state are sharded across ranks and gathered per block for its forward and backward; with train.dtype
  bfloat16 / float16 a MixedPrecisionPolicy computes in that dtype and reduces gradients in float32.

Checkpoints of a sharded model are written with torch.distributed.checkpoint (DCP): every rank writes its
shards, and a load reshards to whatever world size reads it (saved on 2 ranks, resumed on 1, or the reverse).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

PARALLELISMS = {"ddp": "DistributedDataParallel: the whole model on every rank, gradients all-reduced",
                "fsdp": "FSDP2 fully_shard per block and at the root: parameters, gradients, optimizer state sharded"}
LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def shard_model(model: nn.Module, how: str, dtype: str = "float32") -> nn.Module:
    """The model as training uses it: DDP-wrapped, or sharded in place by FSDP2 (returned as is). One process:
    the model itself."""
    if how not in PARALLELISMS:
        raise ValueError(f"unknown parallelism {how!r}; valid: {', '.join(sorted(PARALLELISMS))}")
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    low = LOW.get(dtype)
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
    for block in model.layers:  # gathered one block at a time; the root holds the embedding, final norm, head
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether the model's parameters are DTensors (FSDP2 / tensor parallel)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (an all-gather or a reduction of its partial sums); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def save_sharded(path: Path, model: nn.Module, opt: torch.optim.Optimizer, extra: dict) -> None:
    """A DCP checkpoint directory: model and optimizer state as each rank holds it, plus `extra` (step, loader,
    RNG...; the same on every rank, written once)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, opt_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optimizer": opt_state}, checkpoint_id=str(path))
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(extra, Path(path) / "extra.pt")
    if dist.is_initialized():
        dist.barrier()


def load_sharded(path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Load a DCP checkpoint into this model and optimizer, whatever world size wrote it (DCP reshards); the
    `extra` dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "optimizer": opt_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return torch.load(Path(path) / "extra.pt", weights_only=False)
