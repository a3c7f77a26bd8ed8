"""Run by tests/test_sharded.py under torchrun (2 processes, gloo, CPU). FSDP2 training of a small
Llama against one process training the same model on the whole batch; a DCP checkpoint written by
these 2 ranks at step 3 (read back by 1 process in the test) and one written by 1 process (read here
by 2). Rank 0 writes the numbers to OUT/fsdp.json."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from model import Llama, ModelArgs
from training.checkpoint import load_sharded, save_sharded
from training.distributed import exit_job
from normlab.dist import full
from training.parallel import shard_model

ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16)
STEPS, SAVE_AT, BATCH = 6, 3, 8


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, 64, (BATCH, 17), generator=torch.Generator().manual_seed(100 + step))
    return idx[:, :-1], idx[:, 1:]


def fresh(how: str | None = None):
    """The model (sharded by `how`) and its optimizer, built after sharding: FSDP2 replaces the
    parameters."""
    torch.manual_seed(0)
    model = Llama(ARGS)
    if how:
        shard_model(model, how)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(model, opt, s: int, rows: slice) -> float:
    x, y = batch(s)
    loss = model(x[rows], y[rows])[1]
    loss.backward()
    grads = {n: full(p.grad).norm().item() for n, p in model.named_parameters()}
    opt.step()
    opt.zero_grad(set_to_none=True)
    if dist.is_initialized() and rows != slice(None):
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return loss.item(), grads


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    ref, ref_opt = fresh()  # one process, whole batch
    ref_losses, ref_grads = zip(*[step(ref, ref_opt, s, slice(None)) for s in range(STEPS)], strict=True)
    model, opt = fresh("fsdp")
    losses, grads = [], []
    for s in range(STEPS):
        loss, g = step(model, opt, s, rows)
        losses.append(loss)
        grads.append(g)
        if s + 1 == SAVE_AT:
            save_sharded(out / "ckpt2", model, opt, {"step": SAVE_AT})
    params = {n: full(p).detach() for n, p in model.named_parameters()}
    resumed, ropt = fresh("fsdp")  # a 1-process checkpoint (written by the test) resumed on 2 ranks
    extra = load_sharded(out / "ckpt1", resumed, ropt)
    from_one = [step(resumed, ropt, s, rows)[0] for s in range(extra["step"], STEPS)]
    if rank == 0:
        (out / "fsdp.json").write_text(json.dumps({
            "ref_losses": ref_losses, "losses": losses, "from_one": from_one,
            "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
            "grad_norm_diff": max(abs(g[n] - r[n]) for g, r in zip(grads, ref_grads, strict=True) for n in r),
            "param_diff": max((params[n] - p).abs().max().item() for n, p in ref.named_parameters()),
            "sharded": type(next(model.parameters())).__name__}))
    exit_job()  # a barrier, then os._exit: no gloo teardown at interpreter exit


if __name__ == "__main__":
    main()
