"""Run by tests/test_sharded.py under torchrun (2 processes, gloo, CPU). One small Llama trained in
bfloat16 two ways from the same weights and batches: DDP (autocast, as in one process) and FSDP2.
Records the dtype of every block's input (the residual stream) and of the RoPE tables it receives,
and the losses; rank 0 writes OUT."""

import json
import sys

import torch
import torch.distributed as dist

from model import Llama, ModelArgs
from training.distributed import exit_job
from training.parallel import shard_model

ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16, qk_norm="rmsnorm")


def train(how: str) -> tuple[list[float], list[str]]:
    torch.manual_seed(0)
    model = Llama(ARGS)
    wrapped = shard_model(model, how, "bfloat16")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = set()
    # registered after FSDP's own pre-forward hook: sees what the block receives
    for block in model.layers:
        block.register_forward_pre_hook(lambda m, args: seen.update({f"stream {args[0].dtype}",
                                                                      f"rope {args[1][0].dtype}"}))
    rank, losses = dist.get_rank(), []
    for s in range(4):
        idx = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(100 + s))
        x, y = idx[rank * 4:(rank + 1) * 4, :-1], idx[rank * 4:(rank + 1) * 4, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = wrapped(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses, sorted(seen)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    out = {how: dict(zip(("losses", "dtypes"), train(how), strict=True)) for how in ("ddp", "fsdp")}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    exit_job()
