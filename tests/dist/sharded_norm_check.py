"""Run by tests/test_sharded.py under torchrun (gloo, CPU): every rank holds a slice of the features
of the same input; the sharded norm's outputs and gradients, gathered, must equal the unsharded
norm's. Rank 0 writes the max abs differences to the JSON file given as argv[1]."""

import json
import sys

import torch
import torch.distributed as dist

from model.norms import LayerNorm, RMSNorm
from model.sharded_norms import ShardedNorm, shard_sizes
from training.distributed import exit_job


def check(cls, dim: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(3, 5, dim) * 2 + 0.7  # a mean shift, so centring matters
    w = torch.randn(3, 5, dim)  # loss = sum(y * w): a gradient that differs per feature
    full = cls(dim)
    with torch.no_grad():
        full.weight.uniform_(0.5, 1.5)
    xf = x.clone().requires_grad_()
    (full(xf) * w).sum().backward()
    sizes, rank = shard_sizes(dim, dist.get_world_size()), dist.get_rank()
    part = ShardedNorm.from_norm(full)
    xs = x.split(sizes, -1)[rank].clone().requires_grad_()
    y = part(xs)
    (y * w.split(sizes, -1)[rank]).sum().backward()

    def gather(t):  # pad to the longest shard, all_gather, cut back: the full tensor on every rank
        out = [torch.zeros(*t.shape[:-1], max(sizes)) for _ in sizes]
        dist.all_gather(out, torch.nn.functional.pad(t.detach(), (0, max(sizes) - t.shape[-1])))
        return torch.cat([o[..., :n] for o, n in zip(out, sizes, strict=True)], -1)

    return {"y": (gather(y) - full(x)).abs().max().item(),
            "grad_x": (gather(xs.grad) - xf.grad).abs().max().item(),
            "grad_gain": (gather(part.weight.grad) - full.weight.grad).abs().max().item()}


def main() -> None:
    dist.init_process_group("gloo")
    out = {f"{cls.__name__}/{dim}": check(cls, dim) for cls in (RMSNorm, LayerNorm) for dim in (12, 11)}
    try:
        shard_sizes(1, dist.get_world_size())
    except ValueError as e:
        out["too_few"] = str(e)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    exit_job()  # a barrier, then os._exit: no gloo teardown at interpreter exit


if __name__ == "__main__":
    main()
