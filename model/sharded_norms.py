"""RMSNorm and LayerNorm over a hidden dimension split across the ranks of a process group (tensor
parallelism with the features sharded): each rank holds x[..., its features] and the matching slice
of the gain.

The statistics are sums over all d features, reduced across the group with an autograd-aware
all_reduce (torch's functional collectives: its backward is an all_reduce of the gradients), then
divided by the global d:

    RMSNorm:    ms = all_reduce(sum_j x_j^2) / d,                     y = x * rsqrt(ms + eps) * g
    LayerNorm:  mu = all_reduce(sum_j x_j) / d, xc = x - mu,
                var = all_reduce(sum_j xc_j^2) / d,                   y = xc * rsqrt(var + eps) * g

so outputs and gradients equal the unsharded norm's, for even and uneven shards alike (all-gathering
per-shard means instead has no gradient path and weighs a short shard like a long one). Statistics
in float32, as every norm here (model/norms.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from model.norms import LayerNorm, RMSNorm


def shard_sizes(dim: int, world: int) -> list[int]:
    """How `dim` features split over `world` ranks: as torch.tensor_split does (the first dim %
    world ranks get one more). ValueError if a rank would get none."""
    if dim < world:
        raise ValueError(
            f"cannot shard a norm over {dim} features across {world} ranks: every rank needs >= 1 "
            f"feature (use at most {dim} ranks)"
        )
    return [dim // world + (r < dim % world) for r in range(world)]


def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    # autograd-aware (backward: all_reduce of grads)
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(t, "sum", group if group is not None else dist.group.WORLD)


class ShardedNorm(nn.Module):
    """This rank's slice of a norm over `dim` features (see the module docstring); `center` True is
    LayerNorm, False RMSNorm."""

    def __init__(self, local_dim: int, dim: int, center: bool, eps: float = 1e-5, group=None):
        super().__init__()
        self.local_dim, self.dim, self.center, self.eps, self.group = (
            local_dim,
            dim,
            center,
            eps,
            group,
        )
        self.weight = nn.Parameter(torch.ones(local_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.local_dim:
            raise ValueError(
                f"ShardedNorm holds {self.local_dim} of {self.dim} features; got an input of shape "
                f"{tuple(x.shape)}"
            )
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        if self.center:
            h = h - _all_reduce(h.sum(-1, keepdim=True), self.group) / self.dim
        ms = _all_reduce(h.pow(2).sum(-1, keepdim=True), self.group) / self.dim
        return (h * torch.rsqrt(ms + self.eps)).type_as(x) * self.weight

    @classmethod
    def from_norm(cls, norm: nn.Module, group=None) -> ShardedNorm:
        """This rank's slice of an unsharded RMSNorm or LayerNorm (gain copied; a LayerNorm bias is
        refused)."""
        if not isinstance(norm, (RMSNorm, LayerNorm)) or len(norm.normalized_shape) != 1:
            raise ValueError(f"only RMSNorm and LayerNorm over one dim can be sharded, not {norm}")
        if norm.bias is not None:
            raise ValueError(
                "a sharded LayerNorm with a bias is not supported "
                "(model.norm_options.layernorm.bias=false)"
            )
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        sizes = shard_sizes(norm.normalized_shape[0], world)
        center = isinstance(norm, LayerNorm)
        out = cls(sizes[rank], norm.normalized_shape[0], center, norm.eps, group)
        with torch.no_grad():
            out.weight.copy_(norm.weight.split(sizes)[rank])
        return out.to(norm.weight.device)

    def extra_repr(self) -> str:
        return f"{self.local_dim} of {self.dim} features, center={self.center}, eps={self.eps}"
