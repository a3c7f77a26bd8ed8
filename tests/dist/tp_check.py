"""Run by tests/test_sharded.py under torchrun (2 processes, gloo, CPU): tensor parallelism (tp = 2,
sequence- parallel norms) against one process, for every placement, qk-LayerNorm under RMSNorm
blocks and both logit soft-caps; rank 0 writes the max differences to argv[1]."""

import json
import sys

import torch
import torch.distributed as dist

from model import Llama, ModelArgs
from training.distributed import exit_job
from normlab.dist import full
from training.parallel import shard_model

STEPS = 4


def train(placement: str, norm: str, how: str | None, **extra) -> tuple[list[float], dict, dict]:
    torch.manual_seed(0)
    model = Llama(ModelArgs(**{**dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16,
                                      norm=norm, placement=placement, norm_impl="fused", ops_impl="fused",
                                      qk_norm=norm), **extra}))
    if how:
        shard_model(model, how, tp_size=2)
    # linear in the gradients: float noise stays float noise
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads = [], {}
    for s in range(STEPS):
        idx = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(100 + s))
        loss = model(idx[:, :-1], idx[:, 1:])[1]
        loss.backward()
        if s == 0:  # the first step's gradients: before updates compound the float noise
            grads = {n: full(p.grad).norm().item() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, grads, {n: full(p).detach() for n, p in model.named_parameters()}


def main() -> None:
    dist.init_process_group("gloo")
    out = {}
    # qk_norm=norm (the block norm per head) for every placement and norm; qk-LayerNorm under
    # RMSNorm blocks (its own gains, Replicate DTensors fed head-sharded q and k); with both
    # soft-caps (per head on the explicit attention path, elementwise on the logits): caps of ~1x
    # the logits' size, so they bite
    cases = [(placement, norm, {}) for placement in ("pre", "post", "peri", "reordered", "deepnorm")
             for norm in ("rmsnorm", "layernorm")]
    cases += [(placement, "rmsnorm", {"qk_norm": "layernorm"}) for placement in ("pre", "post")]
    cases += [("pre", "rmsnorm", {"qk_norm": "layernorm", "attn_softcap": 1.0, "logit_softcap": 0.1})]
    # issue 43: LayerNorm Scaling, Mix-LN (1 of 2 layers post), HybridNorm (per-head q/k/v norms),
    # Derf, gated attention per unit and per head
    cases += [("lns", "rmsnorm", {}), ("mixln", "layernorm", {"mix_ln_alpha": 0.5}),
              ("hybrid", "rmsnorm", {"qk_norm": "none"}), ("pre", "derf", {"qk_norm": "none"}),
              ("pre", "rmsnorm", {"attn_gate": "elementwise"}), ("post", "rmsnorm", {"attn_gate": "headwise"})]
    for placement, norm, extra in cases:
        ref, par = train(placement, norm, None, **extra), train(placement, norm, "tp", **extra)
        name = "/".join([placement, norm, *(f"{k}={v}" for k, v in extra.items())])
        out[name] = {
            "loss": max(abs(a - b) for a, b in zip(ref[0], par[0], strict=True)),
            "grad_norm_rel": max(abs(ref[1][n] - par[1][n]) / max(ref[1][n], 1e-3) for n in ref[1]),
            "param": max((ref[2][n] - par[2][n]).abs().max().item() for n in ref[2])}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    exit_job()  # a barrier, then os._exit: no gloo teardown at interpreter exit


if __name__ == "__main__":
    main()
