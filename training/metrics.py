"""Stability probes (torch only, no I/O): per-layer gradient, parameter and update norms, activation
RMS, what each norm receives, DyT's saturated fraction, attention-logit max and attention entropy,
and output-logit statistics.

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

from model.dyt import DyT
from model.layers import softcap
from model.llama import parameter_kinds
from training import distributed
from training.parallel import full, local

# The block's two main norms: what they receive is the residual stream (pre, peri) or the residual
# sum x + f(x) (post). Peri's output norms (which see sublayer outputs) and qk-norms (heads) are
# left out, so norm_in/* and norm/gain/* mean the same thing for every placement.
BLOCK_NORMS = ("attention_norm", "ffn_norm")
# attention scores materialized at once by the logit-max probe (64 MB in float32)
MAX_SCORES = 1 << 24
# |alpha x| from which a DyT unit counts as saturated. float32 tanh rounds to exactly 1.0 from ~9.01
# on (1 - tanh(z) ~ 2 e^(-2z) falls below half an ulp of 1, 2^-25), so d tanh / dz = 1 - tanh^2 is
# exactly 0 there: no gradient reaches x, alpha or the gain through that unit (tests/test_metrics.py
# checks this on torch's own kernels).
DYT_SATURATION = 9.0


def group_parameters(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Parameters by part: layer_{i} for block i, embed, head (an untied output layer) and other
    (final norm)."""
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
    """L2 norm of a (non-empty) list of tensors taken together (sharded ones: over all their
    shards)."""
    return torch.linalg.vector_norm(torch.stack([full(n) for n in torch._foreach_norm(tensors)]))


def _absmax(tensors: list[torch.Tensor]) -> torch.Tensor:
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
    if dist.is_initialized() and dist.get_world_size() > 1:
        m = distributed.all_reduce(m.reshape(1), dist.ReduceOp.MAX).reshape(())
    return m


def _over_ranks(values: dict[str, torch.Tensor], maxima: set[str]) -> dict[str, torch.Tensor]:
    """Per-rank statistics of equal shares of the data, combined over the processes as one process
    would have computed them: means averaged, maxima maxed (two collectives); unchanged in a single
    process."""
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


def saturated_fraction(norm: DyT, x: torch.Tensor) -> torch.Tensor:
    """The fraction of the units of x (this rank's) whose tanh argument |alpha x| is >=
    DYT_SATURATION, computed in float32 as the norm computes it (a sharded alpha is gathered
    first)."""
    alpha = full(norm.alpha).detach().float()
    return ((local(x).detach().float() * alpha).abs() >= DYT_SATURATION).float().mean()


def attention_stats(
    attention: nn.Module, x: torch.Tensor, rope
) -> tuple[torch.Tensor, torch.Tensor]:
    """(max |q.k| / sqrt(d_head) over heads and causal (query, key) pairs, mean attention entropy)
    of one attention layer's input x, in one pass that holds at most MAX_SCORES scores at once: as
    many whole sequences as that holds, or else blocks of query positions of one sequence (a
    100k-token sequence's scores would be 40 GB per head)."""
    q, k = attention.qk(x, rope)  # (B, H, T, hd), (B, kv, T, hd)
    return qk_stats(q, k, getattr(attention, "softcap", 0.0))


def qk_stats(
    q: torch.Tensor, k: torch.Tensor, cap: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """From queries (B, H, T, hd) and keys (B, kv, T, hd): the largest |q.k| / sqrt(d_head) over
    heads and causal pairs (Wortsman et al. 2023: the logits before any soft-capping, so the growth
    a cap hides still shows), and the entropy -sum_j a_ij log a_ij (nats) of the causal attention
    distribution a_i = softmax_j<=i(softcap(logits_ij)) that the layer uses, averaged over batch,
    heads and query positions; float32."""
    # share each kv head with its query group
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    B, H, T, hd = q.shape
    # query positions at a time: all of them when a sequence fits
    rows = max(1, min(T, MAX_SCORES // (H * T)))
    # whole sequences at a time, or one
    chunk = max(1, MAX_SCORES // (H * T * T)) if rows == T else 1
    keys = torch.arange(T, device=q.device)
    best = torch.zeros((), device=q.device)
    entropy = torch.zeros((), device=q.device)
    for b in range(0, B, chunk):
        kb = k[b : b + chunk].float().transpose(-1, -2)
        for r in range(0, T, rows):
            causal = keys[r : r + rows, None] >= keys[None, :]  # (rows, T): key j <= query i
            scores = (q[b : b + chunk, :, r : r + rows].float() @ kb) / math.sqrt(hd)
            best = torch.maximum(best, scores.abs().masked_fill(~causal, 0).amax())
            weights = softcap(scores, cap).masked_fill(~causal, float("-inf")).softmax(-1)
            del scores  # before the weights' log terms exist
            # 0 log 0 = 0: masked keys add nothing
            entropy = entropy - torch.special.xlogy(weights, weights).sum()
            del weights  # before the next block's scores exist
    return best, entropy / (B * H * T)


class StabilityProbe:
    """Collects the per-layer metrics (docs/usage.md, Metrics) of one optimizer step of a Llama."""

    eager = True  # its hooks run outside torch.compile

    def __init__(self, model: nn.Module, every=None):
        self.model = model
        self.every = every  # the probe's cadence (training.step.Every); None: whenever asked
        self.groups = group_parameters(model)
        self.kinds = parameter_kinds(model)
        self.layer_params = {n: p for n, p in model.named_parameters() if n.startswith("layers.")}
        # the trunk: every parameter whose gradient passes through the final norm's input, i.e. all
        # but the readout after it (the output head, and the final norm's gain and bias, which still
        # learn on a saturated tanh's +-1); a tied head is the embedding, listed as the embedding,
        # so a tied model's trunk never goes dead
        readout = {"norm.weight", "norm.bias"}
        self.trunk = [
            p
            for n, p in model.named_parameters()
            if not n.startswith("output.") and n not in readout
        ]
        self.handles: list = []
        self.values: dict[str, torch.Tensor] = {}
        # per forward pass, averaged in finish()
        self.sums: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.before: dict[str, torch.Tensor] = {}

    def due(self, step: int) -> bool:
        """Whether the probe observes optimizer step `step` (counted from 1)."""
        return self.every is None or self.every.due(step)

    # -- forward hooks
    # ------------------------------------------------------------------------------
    def attach(self) -> None:
        for i, block in enumerate(self.model.layers):
            self.handles.append(block.register_forward_hook(self._block_hook(i)))
            self.handles.append(block.attention.register_forward_hook(self._attention_hook(i)))
            for name in BLOCK_NORMS:
                norm = getattr(block, name)
                self.handles.append(norm.register_forward_pre_hook(self._norm_hook(i, name)))
                if isinstance(norm, DyT):
                    self.handles.append(
                        norm.register_forward_pre_hook(self._dyt_hook(f"layer_{i}", name))
                    )
        if isinstance(self.model.norm, DyT):
            self.handles.append(self.model.norm.register_forward_pre_hook(self._dyt_hook("final")))
        if getattr(self.model.norm, "weight", None) is not None:  # a final norm (pre, peri, ...)
            self.handles.append(
                self.model.norm.register_forward_pre_hook(self._energy_hook("final"))
            )

    def _block_hook(self, i: int):
        def hook(module, args, output):
            self.sums[f"act/ms/layer_{i}"].append(local(output).detach().float().pow(2).mean())

        return hook

    def _norm_hook(self, i: int, name: str):
        def hook(module, args):
            # tensor parallel: this rank's positions (combined in finish)
            x = local(args[0]).detach().float()
            # what LayerNorm removes
            self.sums[f"norm_in/mean/layer_{i}"].append(x.mean(-1).abs().mean())
            self.sums[f"norm_in/ms/layer_{i}"].append(x.pow(2).mean())
            # float16: x^2 overflows above 256
            self.sums[f"norm_in/absmax/layer_{i}"].append(x.abs().amax())
            self._energy(f"layer_{i}/{name}", x)

        return hook

    def _energy(self, where: str, x: torch.Tensor) -> None:
        """The sums of norm_in/mean_energy/{where}: mean(x)^2 and mean(x^2) per position."""
        self.sums[f"energy/mean_sq/{where}"].append(x.mean(-1).pow(2).mean())
        self.sums[f"energy/ms/{where}"].append(x.pow(2).mean())

    def _energy_hook(self, where: str):
        def hook(module, args):
            self._energy(where, local(args[0]).detach().float())

        return hook

    def _dyt_hook(self, where: str, name: str | None = None):
        """dyt/saturated/{where}, and per norm dyt/saturated/{where}/{name}: a block's two norms see
        inputs of the same shape, so the mean of their fractions (the layer's) is the fraction of
        both norms' units together."""

        def hook(module, args):
            fraction = saturated_fraction(module, args[0])
            self.sums[f"dyt/saturated/{where}"].append(fraction)
            if name is not None:
                self.sums[f"dyt/saturated/{where}/{name}"].append(fraction)

        return hook

    def _attention_hook(self, i: int):
        def hook(module, args, output):
            with torch.no_grad():
                logit_max, entropy = attention_stats(module, *args)
                self.sums[f"attn/logit_max/layer_{i}"].append(logit_max)
                # a mean: averaged over passes and ranks
                self.sums[f"attn/entropy/layer_{i}"].append(entropy)

        return hook

    def record_logits(self, logits: torch.Tensor) -> None:
        """Output-logit magnitude and mean log partition function of one forward pass."""
        logits = local(logits).detach().float()
        lo, hi = torch.aminmax(logits)  # one pass, no |logits| temporary
        self.sums["logits/max"].append(torch.maximum(hi, -lo))
        self.sums["logits/log_z"].append(torch.logsumexp(logits, -1).mean())

    # -- gradients and updates
    # ------------------------------------------------------------------------
    def record_grads(self) -> None:
        """Gradient norm of each block, the embedding and the head, and the largest |gradient| in
        the trunk (call before clipping)."""
        for key, params in self.groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if key != "other" and grads:
                self.values[f"grad/norm/{key}"] = _norm(grads)
        # exactly 0.0 when no gradient gets past the final norm (every unit of a final DyT
        # saturated: the dead-gradient state, training/monitor.py dead_gradients_at); a max, not a
        # norm, whose squares could underflow to 0
        grads = [p.grad for p in self.trunk if p.grad is not None]
        if grads:
            self.values["grad/absmax/trunk"] = _absmax(grads)

    def snapshot(self) -> None:
        """Copy each block's parameters before the optimizer step (logged steps only)."""
        self.before = {name: p.detach().clone() for name, p in self.layer_params.items()}

    def _update_ratios(self) -> dict[str, torch.Tensor]:
        """||delta W|| / ||W|| per matrix, per layer over its matrices, and over its norm gains (and
        biases) apart: the gains are most of a small block's parameter norm and would otherwise
        drown the matrices' updates."""
        names = list(self.before)
        old = [self.before[n] for n in names]
        old_norms = [
            full(n) for n in torch._foreach_norm(old)
        ]  # sharded parameters: the sums over shards
        delta_norms = [
            full(n)
            for n in torch._foreach_norm(
                torch._foreach_sub([self.layer_params[n].detach() for n in names], old)
            )
        ]
        # layer -> "matrices" / "gains" -> [(delta, old)]
        out, parts = ({}, defaultdict(lambda: defaultdict(list)))
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
                    out[f"param/norm/layer_{i}"], out[f"update/ratio/layer_{i}"] = (
                        norm,
                        delta / norm,
                    )
                else:
                    out[f"update/ratio/layer_{i}/gains"] = delta / norm
        return out

    def finish(self) -> dict[str, float]:
        """Remove the hooks and return every metric as a float, read back with one device sync."""
        for h in self.handles:
            h.remove()
        self.handles = []
        values = dict(self.values)
        maxima = {
            k
            for k in self.sums
            if k.startswith(("attn/logit_max/", "logits/max")) or "/absmax/" in k
        }
        pooled = {
            k: torch.stack(parts).amax() if k in maxima else torch.stack(parts).mean()
            for k, parts in self.sums.items()
        }
        # each rank saw its share of the batch (and positions, under TP)
        pooled = _over_ranks(pooled, maxima)
        layers = defaultdict(list)
        for key in [k for k in pooled if k.startswith("energy/mean_sq/")]:
            # each norm's share of its inputs' energy in the mean direction: sum of mean(x)^2 over
            # sum of mean(x^2) (LN(x) = RMSNorm(x - mean(x)), whose square RMS is mean(x^2)(1 -
            # it)); a layer's: the mean of its two norms' (scale-free: post-norm's two norms see
            # inputs of very different RMS)
            where = key[len("energy/mean_sq/") :]
            ms = pooled.pop(f"energy/ms/{where}")
            values[f"norm_in/mean_energy/{where}"] = pooled.pop(key) / ms.clamp_min(1e-30)
            if "/" in where:
                layers[where.split("/")[0]].append(values[f"norm_in/mean_energy/{where}"])
        for layer, parts in layers.items():
            values[f"norm_in/mean_energy/{layer}"] = torch.stack(parts).mean()
        for key, value in pooled.items():
            if "/ms/" in key:  # mean squares average over forward passes; report their root
                key, value = key.replace("/ms/", "/rms/"), value.sqrt()
            values[key] = value
        if self.before:
            values.update(self._update_ratios())
        for i, block in enumerate(self.model.layers):
            gains = [
                getattr(block, n).weight
                for n in BLOCK_NORMS
                if getattr(block, n).weight is not None
            ]
            if gains:
                values[f"norm/gain/layer_{i}"] = torch.cat(
                    [full(g).detach().float().flatten() for g in gains]
                ).mean()
        self.values, self.sums, self.before = {}, defaultdict(list), {}
        keys = list(values)
        numbers = (
            torch.stack([values[k].float().reshape(()) for k in keys]).tolist() if keys else []
        )
        return dict(zip(keys, numbers, strict=True))
