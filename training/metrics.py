"""Stability probes (torch only, no I/O): per-layer gradient, parameter and update norms, activation RMS,
what each norm receives, attention-logit max and output-logit statistics.

Used on logged steps only, in this order around one optimizer step:

    probe = StabilityProbe(model)
    probe.attach()                      # forward hooks, for this step's forward passes only
    ... forward(s), backward(s) ...     # probe.record_logits(logits) after each forward
    probe.record_grads()                # before clipping: the norms clip_grad_norm_ sees
    probe.snapshot()                    # parameters before the update
    opt.step()
    metrics = probe.finish()            # removes the hooks; one device sync for every number

The hooks only read: outputs and gradients are bitwise the same with or without them.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn

from model.llama import parameter_kinds
from training import distributed
from training.parallel import full, local

# The block's two main norms: what they receive is the residual stream (pre, peri) or the residual sum
# x + f(x) (post). Peri's output norms (which see sublayer outputs) and qk-norms (heads) are left out, so
# norm_in/* and norm/gain/* mean the same thing for every placement.
BLOCK_NORMS = ("attention_norm", "ffn_norm")
MAX_SCORES = 1 << 24  # attention scores materialized at once by the logit-max probe (64 MB in float32)


def group_parameters(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Parameters by part: layer_{i} for block i, embed, head (an untied output layer) and other (final norm)."""
    groups: dict[str, list[nn.Parameter]] = defaultdict(list)
    for name, p in model.named_parameters():  # a tied head is the embedding, listed once
        if name.startswith("layers."):
            groups[f"layer_{name.split('.')[1]}"].append(p)
        elif name.startswith("tok_embeddings."):
            groups["embed"].append(p)
        elif name.startswith("output."):
            groups["head"].append(p)
        else:
            groups["other"].append(p)
    return dict(groups)


def _norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of a (non-empty) list of tensors taken together (sharded ones: over all their shards)."""
    return torch.linalg.vector_norm(torch.stack([full(n) for n in torch._foreach_norm(tensors)]))


def _over_ranks(values: dict[str, torch.Tensor], maxima: set[str]) -> dict[str, torch.Tensor]:
    """Per-rank statistics of equal shares of the data, combined over the processes as one process would have
    computed them: means averaged, maxima maxed (two collectives); unchanged in a single process."""
    import torch.distributed as dist

    if not values or not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    keys = sorted(values)
    out = {}
    for group, op in ((set(keys) - maxima, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX)):
        names = [k for k in keys if k in group]
        if names:
            t = torch.stack([values[k].float().reshape(()) for k in names])
            t = distributed.all_reduce(t, op)
            t = t / dist.get_world_size() if op == dist.ReduceOp.SUM else t
            out.update(zip(names, t, strict=True))
    return out


def attention_logit_max(attention: nn.Module, x: torch.Tensor, rope) -> torch.Tensor:
    """max |q.k| / sqrt(d_head) over heads and causal (query, key) pairs, without keeping all scores: at most
    MAX_SCORES of them at once, as many whole sequences as that holds, or else blocks of query positions of one
    sequence (a 100k-token sequence's scores would be 40 GB per head; its causal mask alone 10 GB)."""
    q, k = attention.qk(x, rope)  # (B, H, T, hd), (B, kv, T, hd)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # share each kv head with its query group
    B, H, T, hd = q.shape
    rows = max(1, min(T, MAX_SCORES // (H * T)))  # query positions at a time: all of them when a sequence fits
    chunk = max(1, MAX_SCORES // (H * T * T)) if rows == T else 1
    keys = torch.arange(T, device=x.device)
    best = torch.zeros((), device=x.device)
    for b in range(0, B, chunk):
        kb = k[b:b + chunk].float().transpose(-1, -2)
        for r in range(0, T, rows):
            causal = keys[r:r + rows, None] >= keys[None, :]  # (rows, T): key j <= query i
            scores = (q[b:b + chunk, :, r:r + rows].float() @ kb).abs() / math.sqrt(hd)
            best = torch.maximum(best, scores.masked_fill(~causal, 0).amax())
            del scores  # before the next block's scores exist
    return best


class StabilityProbe:
    """Collects the per-layer metrics of DESIGN.md for one optimizer step of a Llama."""

    eager = True  # its hooks run outside torch.compile

    def __init__(self, model: nn.Module, every=None):
        self.model = model
        self.every = every  # the probe's cadence (training.step.Every); None: whenever asked
        self.groups = group_parameters(model)
        self.kinds = parameter_kinds(model)
        self.layer_params = {n: p for n, p in model.named_parameters() if n.startswith("layers.")}
        self.handles: list = []
        self.values: dict[str, torch.Tensor] = {}
        self.sums: dict[str, list[torch.Tensor]] = defaultdict(list)  # per forward pass, averaged in finish()
        self.before: dict[str, torch.Tensor] = {}

    def due(self, step: int) -> bool:
        """Whether the probe observes optimizer step `step` (counted from 1)."""
        return self.every is None or self.every.due(step)

    # -- forward hooks ------------------------------------------------------------------------------
    def attach(self) -> None:
        for i, block in enumerate(self.model.layers):
            self.handles.append(block.register_forward_hook(self._block_hook(i)))
            self.handles.append(block.attention.register_forward_hook(self._attention_hook(i)))
            for name in BLOCK_NORMS:
                self.handles.append(getattr(block, name).register_forward_pre_hook(self._norm_hook(i)))

    def _block_hook(self, i: int):
        def hook(module, args, output):
            self.sums[f"act/ms/layer_{i}"].append(local(output).detach().float().pow(2).mean())
        return hook

    def _norm_hook(self, i: int):
        def hook(module, args):
            x = local(args[0]).detach().float()  # tensor parallel: this rank's positions (combined in finish)
            self.sums[f"norm_in/mean/layer_{i}"].append(x.mean(-1).abs().mean())  # what LayerNorm removes
            self.sums[f"norm_in/ms/layer_{i}"].append(x.pow(2).mean())
            self.sums[f"norm_in/absmax/layer_{i}"].append(x.abs().amax())  # float16: x^2 overflows above 256
        return hook

    def _attention_hook(self, i: int):
        def hook(module, args, output):
            with torch.no_grad():
                self.sums[f"attn/logit_max/layer_{i}"].append(attention_logit_max(module, *args))
        return hook

    def record_logits(self, logits: torch.Tensor) -> None:
        """Output-logit magnitude and mean log partition function of one forward pass."""
        logits = local(logits).detach().float()
        lo, hi = torch.aminmax(logits)  # one pass, no |logits| temporary
        self.sums["logits/max"].append(torch.maximum(hi, -lo))
        self.sums["logits/log_z"].append(torch.logsumexp(logits, -1).mean())

    # -- gradients and updates ------------------------------------------------------------------------
    def record_grads(self) -> None:
        """Gradient norm of each block, the embedding and the head (call before clipping)."""
        for key, params in self.groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if key != "other" and grads:
                self.values[f"grad/norm/{key}"] = _norm(grads)

    def snapshot(self) -> None:
        """Copy each block's parameters before the optimizer step (logged steps only)."""
        self.before = {name: p.detach().clone() for name, p in self.layer_params.items()}

    def _update_ratios(self) -> dict[str, torch.Tensor]:
        """||delta W|| / ||W|| per matrix, per layer over its matrices, and over its norm gains (and biases) apart:
        the gains are most of a small block's parameter norm and would otherwise drown the matrices' updates."""
        names = list(self.before)
        old = [self.before[n] for n in names]
        old_norms = [full(n) for n in torch._foreach_norm(old)]  # sharded parameters: the sums over shards
        delta_norms = [full(n) for n in torch._foreach_norm(
            torch._foreach_sub([self.layer_params[n].detach() for n in names], old))]
        out, parts = {}, defaultdict(lambda: defaultdict(list))  # layer -> "matrices" / "gains" -> [(delta, old)]
        for name, o, d in zip(names, old_norms, delta_norms, strict=True):
            _, i, rest = name.split(".", 2)  # layers.{i}.attention.wq.weight
            if self.kinds[name] == "matrix":
                out[f"update/ratio/layer_{i}/{rest.removesuffix('.weight')}"] = d / o
                parts[i]["matrices"].append((d, o))
            else:
                parts[i]["gains"].append((d, o))
        for i, groups in parts.items():
            for group, pairs in groups.items():
                delta = torch.linalg.vector_norm(torch.stack([d for d, _ in pairs]))
                norm = torch.linalg.vector_norm(torch.stack([o for _, o in pairs]))
                if group == "matrices":
                    out[f"param/norm/layer_{i}"], out[f"update/ratio/layer_{i}"] = norm, delta / norm
                else:
                    out[f"update/ratio/layer_{i}/gains"] = delta / norm
        return out

    def finish(self) -> dict[str, float]:
        """Remove the hooks and return every metric as a float, read back with one device sync."""
        for h in self.handles:
            h.remove()
        self.handles = []
        values = dict(self.values)
        maxima = {k for k in self.sums if k.startswith(("attn/", "logits/max")) or "/absmax/" in k}
        pooled = {k: torch.stack(parts).amax() if k in maxima else torch.stack(parts).mean()
                  for k, parts in self.sums.items()}
        pooled = _over_ranks(pooled, maxima)  # each rank saw its share of the batch (and positions, under TP)
        for key, value in pooled.items():
            if "/ms/" in key:  # mean squares average over forward passes; report their root
                key, value = key.replace("/ms/", "/rms/"), value.sqrt()
            values[key] = value
        if self.before:
            values.update(self._update_ratios())
        for i, block in enumerate(self.model.layers):
            gains = [getattr(block, n).weight for n in BLOCK_NORMS if getattr(block, n).weight is not None]
            if gains:
                values[f"norm/gain/layer_{i}"] = torch.cat([full(g).detach().float().flatten() for g in gains]).mean()
        self.values, self.sums, self.before = {}, defaultdict(list), {}
        keys = list(values)
        numbers = torch.stack([values[k].float().reshape(()) for k in keys]).tolist() if keys else []
        return dict(zip(keys, numbers, strict=True))
