"""How the model is spread over processes, on PyTorch's own engine (torch.distributed), launched by
torchrun:

- `ddp`: every rank holds the whole model and optimizer state; gradients are all-reduced
  (DistributedDataParallel).
- `tp`: tensor parallelism over a 2-D mesh (data x tensor, train.tp_size ranks per tensor group)
  through DTensor `parallelize_module`, Megatron-style with sequence parallelism (torchtitan's
  plan): q/k/v and w1/w3 column-wise, wo and w2 row-wise, every norm sequence-parallel (each rank
  normalizes its share of the positions over the full hidden dim, so no norm statistic crosses
  ranks), the embedding row-wise and the head column-wise; FSDP2 over the data dimension when it has
  more than one rank.
- `fsdp`: FSDP2 (`fully_shard`) per block and at the root over a 1-D mesh: parameters, gradients and
  AdamW state are sharded across ranks and gathered per block for its forward and backward; with
  train.dtype bfloat16 / float16 the blocks' matrices are gathered in that dtype, everything else
  (the residual stream, RoPE, the norms' gains) stays float32 as under autocast, and gradients are
  reduced in float32.

Checkpoints of a sharded model (DCP directories that reshard on load) are training/checkpoint.py's.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from training.config import ConfigError

PARALLELISMS = {
    "ddp": "DistributedDataParallel: the whole model on every rank, gradients all-reduced",
    "tp": "tensor parallel (column/row-wise matmuls, sequence-parallel norms) x FSDP2 over data",
    "fsdp": "FSDP2 fully_shard per block and at the root: parameters, gradients, optimizer state",
}
LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def shard_model(model: nn.Module, how: str, dtype: str = "float32", tp_size: int = 2) -> nn.Module:
    """The model as training uses it: DDP-wrapped, or sharded in place by FSDP2 / tensor parallelism
    (returned as is). One process: the model itself."""
    if how not in PARALLELISMS:
        raise ConfigError(f"unknown parallelism {how!r}; valid: {', '.join(sorted(PARALLELISMS))}")
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh

    device, world = next(model.parameters()).device.type, dist.get_world_size()
    if how == "fsdp":
        return _fsdp(model, init_device_mesh(device, (world,)), dtype)
    if world % tp_size:
        raise ConfigError(f"train.tp_size={tp_size} must divide the number of processes ({world})")
    mesh = init_device_mesh(device, (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    tensor_parallel(model, mesh["tp"])
    return _fsdp(model, mesh["dp"], dtype) if world > tp_size else model


def check_layout(how: str, world: int, tp_size: int, args, seq_len: int) -> None:
    """Raise ValueError (one line) when `how` cannot spread this model over `world` processes:
    checked first, before anything divides by the number of tensor groups (data_coords) or shards.
    Tensor parallelism needs tp_size to divide the process count, seq_len to split evenly over a
    group (sequence-parallel norms: each rank holds an equal share of the positions; an uneven split
    made gloo abort on mismatched collectives) and the heads and hidden units to split evenly
    too."""
    if how not in PARALLELISMS:
        raise ConfigError(f"unknown parallelism {how!r}; valid: {', '.join(sorted(PARALLELISMS))}")
    if world == 1 and how != "ddp":
        raise ConfigError(
            f"train.parallel={how} shards the model over torchrun's processes, and "
            f"this is one process: launch it with torchrun --nproc_per_node N, or "
            f"pass train.parallel=ddp to train the whole model here"
        )
    if world == 1 or how != "tp":
        return
    if world % tp_size:
        fits = max(n for n in range(1, min(tp_size, world) + 1) if world % n == 0)
        raise ConfigError(
            f"train.tp_size={tp_size} must divide the number of processes ({world}), "
            f"e.g. train.tp_size={fits}"
        )
    if seq_len % tp_size:
        raise ConfigError(
            f"train.parallel=tp needs train.seq_len divisible by "
            f"train.tp_size={tp_size} (each rank of a tensor group holds an equal "
            f"share of the positions), got {seq_len}: e.g. "
            f"train.seq_len={seq_len - seq_len % tp_size or tp_size}"
        )
    if args.tie_embeddings:
        raise ConfigError(
            "tensor parallelism needs model.tie_embeddings=false (the embedding is "
            "sharded by rows of the vocabulary, the head by its output columns)"
        )
    if args.qk_norm == "olmo2":
        raise ConfigError(
            "model.qk_norm=olmo2 normalizes q and k over every head at once, and tensor "
            "parallelism splits the heads over ranks: use model.qk_norm=rmsnorm (per head) with tp"
        )
    for name, count in (
        ("n_heads", args.n_heads),
        ("n_kv_heads", args.kv_heads),
        ("ffn hidden dim", args.ffn_hidden_dim),
    ):
        if count % tp_size:
            raise ConfigError(
                f"tensor parallelism over {tp_size} ranks needs model {name} "
                f"({count}) divisible by {tp_size}"
            )


def split_batch(tc, data_world: int) -> tuple[int, int]:
    """(sequences per forward pass and process, micro-batches per optimizer step).

    train.batch_size split into data_world shares, each into micro-batches of
    train.micro_batch_size (0: the whole share)."""
    per_rank = tc.batch_size // data_world
    if tc.batch_size % data_world or per_rank == 0:
        raise ConfigError(
            f"train.batch_size={tc.batch_size} must split evenly into the "
            f"{data_world} data-parallel shares of this job (a multiple of "
            f"{data_world})"
        )
    micro = tc.micro_batch_size or per_rank
    if per_rank % micro:
        raise ConfigError(
            f"train.micro_batch_size={micro} must divide each data-parallel share of "
            f"train.batch_size={tc.batch_size} ({per_rank} sequences on each of "
            f"{data_world} shares)"
        )
    return micro, per_rank // micro


def data_coords(rank: int, world: int, how: str, tp_size: int) -> tuple[int, int]:
    """(this process's share of the data, the number of shares): every rank its own, except that the
    ranks of a tensor-parallel group (consecutive ranks) read the same data."""
    return (rank // tp_size, world // tp_size) if how == "tp" and world > 1 else (rank, world)


def _fsdp(model: nn.Module, mesh, dtype: str) -> nn.Module:
    """FSDP2 with the numerics of autocast, so that fsdp and ddp runs of one config are the same
    experiment.

    FSDP's default mixed precision casts every module input to param_dtype: the residual stream and
    the RoPE tables would become bfloat16 (float16 overflows there), while autocast keeps them
    float32 and casts only at the matmuls. So: the blocks' matrices are gathered in the autocast
    dtype (the same rounding autocast applies per matmul) without casting inputs, the norms' gains
    and the root (embedding, final norm, head) stay float32, and the step runs under autocast as in
    one process; gradients are reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from model.norm_config import NORMS

    low = LOW.get(dtype)
    exact = MixedPrecisionPolicy(reduce_dtype=torch.float32)  # parameters as stored (float32)
    matmuls = (
        MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32, cast_forward_inputs=False)
        if low
        else exact
    )
    norms = tuple(NORMS.values())
    # gathered one block at a time; the root holds the embedding, final norm, head
    for block in model.layers:
        for module in block.modules():
            if (
                low
                and isinstance(module, norms)
                and any(True for _ in module.parameters(recurse=False))
            ):
                # its own unit: the gains stay float32
                fully_shard(module, mesh=mesh, mp_policy=exact)
        fully_shard(block, mesh=mesh, mp_policy=matmuls)
    fully_shard(model, mesh=mesh, mp_policy=exact)
    return model


def tensor_parallel(model: nn.Module, mesh) -> nn.Module:
    """Shard the model's matmuls over `mesh` (1-D, the tensor group) in place; see the module
    docstring. The residual stream stays a local tensor holding this rank's positions (sequence
    parallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    args, n = model.args, mesh.size()
    if args.tie_embeddings:
        raise ConfigError(
            "tensor parallelism needs model.tie_embeddings=false (the embedding is "
            "sharded by rows of the vocabulary, the head by its output columns)"
        )
    for name, count in (
        ("n_heads", args.n_heads),
        ("n_kv_heads", args.kv_heads),
        ("ffn hidden dim", args.ffn_hidden_dim),
    ):
        if count % n:
            raise ConfigError(
                f"tensor parallelism over {n} ranks needs model {name} ({count}) divisible by {n}"
            )
    norm = SequenceParallel(use_local_output=True)
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": norm,
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    for block in model.layers:
        plan = {name: norm for name, _ in block.named_children() if name.endswith("norm")}
        plan.update(
            {
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None),
                    desired_input_layouts=(Replicate(), None),
                    use_local_output=True,
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    use_local_output=True,
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            }
        )
        if hasattr(block.feed_forward, "w3"):
            plan["feed_forward.w3"] = ColwiseParallel()
        # qk-norm (and HybridNorm's v-norm) gains are shared by every head, and a rank holds its own
        # heads (dim 2 of q, k and v before the transpose): Replicate DTensors fed a head-sharded
        # input, as torchtitan shards qwen3's q/k norms, so autograd sums their gradients over the
        # group and FSDP / clipping / DCP see DTensors like every other
        for name in ("attention.q_norm", "attention.k_norm", "attention.v_norm"):
            if any(True for _ in block.get_submodule(name).parameters()):
                plan[name] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if block.attention.w_gate is not None:  # its columns are per head, as wq's: the same split
            plan["attention.w_gate"] = ColwiseParallel()
        parallelize_module(block, mesh, plan)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether the model's parameters are DTensors (FSDP2 / tensor parallel)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def no_sync(module: nn.Module):
    """A context in which backward accumulates gradients without reducing them across ranks (all but
    the last micro-batch): DDP's no_sync, FSDP2's set_requires_gradient_sync(False)."""
    from contextlib import nullcontext

    if hasattr(module, "no_sync"):
        return module.no_sync()
    if not hasattr(module, "set_requires_gradient_sync"):
        return nullcontext()

    @contextmanager
    def paused():
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    return paused()
