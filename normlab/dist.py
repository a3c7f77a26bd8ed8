"""Distributed tensors the monitor reads: a DTensor's full value or this rank's part, and statistics
of equal shares of the data combined over the processes (torch.distributed only)."""

from __future__ import annotations

import torch


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (an all-gather or a reduction of its partial sums); a plain tensor as
    it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (e.g. its positions under sequence parallelism); a plain tensor
    as it is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def world() -> int:
    """The number of processes (1 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    """Sum (or op) of t over processes, in place; identity in a single process."""
    import torch.distributed as dist

    if world() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op)
    return t


def norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of a (non-empty) list of tensors taken together (sharded ones: over all their
    shards)."""
    return torch.linalg.vector_norm(torch.stack([full(n) for n in torch._foreach_norm(tensors)]))


def absmax(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The largest |entry| of a (non-empty) list of tensors, sharded ones over every rank's shard:
    each rank's own maximum, then one all-reduce (MAX) where there are several processes. (An inf
    norm of a DTensor would raise on a rank whose shard is empty, FSDP's share of a one-element
    alpha, and leave the others waiting.)"""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    # a Partial gradient (tensor parallel: a replicated parameter fed this rank's positions) is a
    # sum over ranks: reduce it before taking its largest entry
    shards = [
        local(
            full(t) if isinstance(t, DTensor) and any(p.is_partial() for p in t.placements) else t
        ).detach()
        for t in tensors
    ]
    m = torch.zeros((), device=shards[0].device)
    for s in shards:
        if s.numel():
            m = torch.maximum(m, s.abs().amax().float())
    if world() > 1:
        m = all_reduce(m.reshape(1), dist.ReduceOp.MAX).reshape(())
    return m


def over_ranks(values: dict[str, torch.Tensor], maxima: set[str]) -> dict[str, torch.Tensor]:
    """Per-rank statistics of equal shares of the data, combined over the processes as one process
    would have computed them: means averaged, maxima maxed (two collectives); unchanged in a single
    process."""
    import torch.distributed as dist

    if not values or world() == 1:
        return values
    keys = sorted(values)
    out = {}
    for group, op in ((set(keys) - maxima, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX)):
        names = [k for k in keys if k in group]
        if names:
            t = torch.stack([values[k].float().reshape(()) for k in names])
            t = all_reduce(t, op)
            t = t / world() if op == dist.ReduceOp.SUM else t
            out.update(zip(names, t, strict=True))
    return out
