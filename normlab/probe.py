"""The monitor's core: the stability metrics of one optimizer step of any model, computed from the
tensors its hooks are handed (torch only, no I/O). A Layout (normlab/layout.py) says where things
are; the metric keys are docs/usage.md's glossary:

    grad/norm/layer_{i}, embed, head (other)   gradient norms before clipping, per part
    grad/absmax/trunk                          the largest |gradient| below the final norm
    update/ratio/layer_{i}[/<matrix>|/gains]   ||delta W|| / ||W|| of the step
    param/norm/layer_{i}                       the norm of a block's matrices
    act/rms/layer_{i}                          the RMS of each block's output
    norm_in/{mean,rms,absmax}/layer_{i}        what the block's residual norms receive
    norm_in/mean_energy/...                    the share of that energy in the mean direction
    norm/gain/layer_{i}                        the mean gain of the block's residual norms
    attn/logit_max/layer_{i}, attn/entropy/... the largest attention logit, attention entropy
    logits/max, logits/log_z                   output-logit magnitude, mean log partition function
    dyt/saturated/...                          DyT units whose tanh is saturated

Used on probed steps only, in this order around one optimizer step:

    probe = StabilityProbe(model)        # auto_layout(model) unless a layout is given
    probe.attach()                       # forward hooks, for this step's forward passes only
    ... forward(s), backward(s) ...      # probe.record_logits(logits) unless hooked (logits=True)
    probe.record_grads()                 # before clipping: the norms clip_grad_norm_ sees
    probe.snapshot()                     # parameters before the update
    opt.step()
    metrics = probe.finish()             # removes the hooks; one device sync for every number

Where the host clips before it lets anyone see the gradients (transformers' Trainer), attach with
grads=True: gradient hooks record each parameter's norm as its gradient is accumulated (the last,
whole one counts), and record_grads() reads those. The hooks only read: outputs and gradients are
bitwise the same with or without them."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from normlab.attention import SdpaCapture, qk_stats
from normlab.dist import absmax, full, local, norm, over_ranks
from normlab.layout import Layout, auto_layout, is_squash

# |alpha x| from which a DyT unit counts as saturated. float32 tanh rounds to exactly 1.0 from ~9.01
# on (1 - tanh(z) ~ 2 e^(-2z) falls below half an ulp of 1, 2^-25), so d tanh / dz = 1 - tanh^2 is
# exactly 0 there: no gradient reaches x, alpha or the gain through that unit.
DYT_SATURATION = 9.0


def saturated_fraction(squash: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The fraction of the units of x (this rank's) whose tanh argument |alpha x| is >=
    DYT_SATURATION, in float32 as the norm computes it (a sharded alpha is gathered first)."""
    alpha = full(squash.alpha).detach().float()
    return ((local(x).detach().float() * alpha).abs() >= DYT_SATURATION).float().mean()


def _tensor(output) -> torch.Tensor | None:
    """A module's main output tensor: itself, a tuple's first element, or a model output's
    logits."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


class StabilityProbe:
    """Collects the per-layer metrics of one optimizer step (module docstring)."""

    eager = True  # its hooks run outside torch.compile

    def __init__(self, model: nn.Module, every=None, layout: Layout | None = None):
        self.model = model
        self.every = every  # the cadence (anything with due(step)); None: whenever asked
        self.layout = layout if layout is not None else auto_layout(model)
        self.handles: list = []
        self.values: dict[str, torch.Tensor] = {}
        self.sums: dict[str, list[torch.Tensor]] = defaultdict(list)  # per pass, pooled in finish
        self.before: dict[str, torch.Tensor] = {}
        self.grad_norms: dict[int, torch.Tensor] = {}  # grads=True: id(p) -> its gradient's norm
        self.grad_max: dict[int, torch.Tensor] = {}
        self.block = None  # the block whose forward is running (attention calls are its)
        self.capture = None

    def due(self, step: int) -> bool:
        """Whether the probe observes optimizer step `step` (counted from 1)."""
        return self.every is None or self.every.due(step)

    # -- forward hooks ---------------------------------------------------------------------------
    def attach(self, logits: bool = False, grads: bool = False) -> None:
        """Hook this step's forward passes; `logits`: the model's output too (else call
        record_logits); `grads`: each gradient as it is accumulated (a host that clips first)."""
        lay = self.layout
        for i, block in enumerate(lay.blocks):
            self.handles.append(block.register_forward_pre_hook(self._enter(i)))
            self.handles.append(block.register_forward_hook(self._block_hook(i), always_call=True))
            if lay.attention == "qk":
                hook = self._qk_hook(i)
                self.handles.append(block.attention.register_forward_hook(hook))
            for name, n in lay.norms[i].items():
                self.handles.append(n.register_forward_pre_hook(self._norm_hook(i, name)))
                if is_squash(n):
                    hook = self._dyt_hook(f"layer_{i}", name)
                    self.handles.append(n.register_forward_pre_hook(hook))
        final = lay.final_norm
        if final is not None and is_squash(final):
            self.handles.append(final.register_forward_pre_hook(self._dyt_hook("final")))
        if final is not None and getattr(final, "weight", None) is not None:
            self.handles.append(final.register_forward_pre_hook(self._energy_hook("final")))
        if logits:
            self.handles.append(self.model.register_forward_hook(self._logits_hook))
        if grads:
            for _, params in lay.groups.items():
                for _, p in params:
                    if p.requires_grad:
                        self.handles.append(p.register_post_accumulate_grad_hook(self._grad_hook))

    def _enter(self, i: int):
        def hook(module, args):
            self.block = i
            if self.layout.attention == "sdpa" and self.capture is None:
                self.capture = SdpaCapture(self._attention)
                self.capture.__enter__()

        return hook

    def _leave(self) -> None:
        if self.capture is not None:
            capture, self.capture = self.capture, None
            capture.__exit__(None, None, None)
        self.block = None

    def _block_hook(self, i: int):
        def hook(module, args, output):
            self._leave()
            out = _tensor(output)
            if out is not None:
                self.sums[f"act/ms/layer_{i}"].append(local(out).detach().float().pow(2).mean())

        return hook

    def _norm_hook(self, i: int, name: str):
        def hook(module, args):
            x = local(args[0]).detach().float()  # tensor parallel: this rank's positions
            self.sums[f"norm_in/mean/layer_{i}"].append(x.mean(-1).abs().mean())  # what LN removes
            self.sums[f"norm_in/ms/layer_{i}"].append(x.pow(2).mean())
            self.sums[f"norm_in/absmax/layer_{i}"].append(x.abs().amax())  # float16 x^2 overflows
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
        """dyt/saturated/{where}, and per norm dyt/saturated/{where}/{name}: a block's norms see
        inputs of the same shape, so the mean of their fractions is the layer's."""

        def hook(module, args):
            fraction = saturated_fraction(module, args[0])
            self.sums[f"dyt/saturated/{where}"].append(fraction)
            if name is not None:
                self.sums[f"dyt/saturated/{where}/{name}"].append(fraction)

        return hook

    def _qk_hook(self, i: int):
        def hook(module, args, output):
            with torch.no_grad():
                q, k = module.qk(*args)  # (B, H, T, hd), (B, kv, T, hd)
                self._logits_of(i, q, k, getattr(module, "softcap", 0.0), None, None, True)

        return hook

    def _attention(self, q, k, scale, mask, causal) -> None:
        if self.block is not None:
            self._logits_of(self.block, q, k, 0.0, scale, mask, causal)

    def _logits_of(self, i, q, k, cap, scale, mask, causal) -> None:
        logit_max, entropy = qk_stats(local(q), local(k), cap, scale, mask, causal)
        self.sums[f"attn/logit_max/layer_{i}"].append(logit_max)
        self.sums[f"attn/entropy/layer_{i}"].append(entropy)  # a mean over passes and ranks

    def _logits_hook(self, module, args, output) -> None:
        out = _tensor(output)
        if out is not None and out.dim() >= 2:
            self.record_logits(out)

    def record_logits(self, logits: torch.Tensor) -> None:
        """Output-logit magnitude and mean log partition function of one forward pass."""
        logits = local(logits).detach().float()
        lo, hi = torch.aminmax(logits)  # one pass, no |logits| temporary
        self.sums["logits/max"].append(torch.maximum(hi, -lo))
        self.sums["logits/log_z"].append(torch.logsumexp(logits, -1).mean())

    # -- gradients and updates -------------------------------------------------------------------
    def _grad_hook(self, p: torch.Tensor) -> None:
        g = p.grad.detach()
        self.grad_norms[id(p)] = torch.linalg.vector_norm(g.float())
        self.grad_max[id(p)] = g.abs().amax().float() if g.numel() else torch.zeros(())

    def record_grads(self, others: bool = False) -> None:
        """Gradient norm of each block, the embedding and the head (and the rest, `others`), and
        the largest |gradient| in the trunk: call before clipping (or after attach(grads=True))."""
        hooked = bool(self.grad_norms)
        for key, params in self.layout.groups.items():
            if key == "other" and not others:
                continue
            if hooked:
                norms = [self.grad_norms[id(p)] for _, p in params if id(p) in self.grad_norms]
                if norms:
                    self.values[f"grad/norm/{key}"] = torch.linalg.vector_norm(torch.stack(norms))
                continue
            grads = [p.grad for _, p in params if p.grad is not None]
            if grads:
                self.values[f"grad/norm/{key}"] = norm(grads)
        # exactly 0.0 when no gradient gets past the final norm (the dead-gradient state); a max,
        # not a norm, whose squares could underflow to 0
        if hooked:
            maxima = [self.grad_max[id(p)] for p in self.layout.trunk if id(p) in self.grad_max]
            if maxima:
                self.values["grad/absmax/trunk"] = torch.stack(maxima).amax()
            return
        grads = [p.grad for p in self.layout.trunk if p.grad is not None]
        if grads:
            self.values["grad/absmax/trunk"] = absmax(grads)

    def snapshot(self) -> None:
        """Copy each block's parameters before the optimizer step."""
        self.before = {
            name: p.detach().clone()
            for key, params in self.layout.groups.items()
            if key.startswith("layer_")
            for name, p in params
        }

    def _update_ratios(self) -> dict[str, torch.Tensor]:
        """||delta W|| / ||W|| per matrix, per layer over its matrices, and over its norm gains
        (and biases) apart: the gains are most of a small block's parameter norm and would
        otherwise drown the matrices' updates."""
        params = {
            name: (key[len("layer_") :], p)
            for key, ps in self.layout.groups.items()
            if key.startswith("layer_")
            for name, p in ps
        }
        names = list(self.before)
        old = [self.before[n] for n in names]
        old_norms = [full(n) for n in torch._foreach_norm(old)]  # sharded: over every shard
        new = [params[n][1].detach() for n in names]
        delta_norms = [full(n) for n in torch._foreach_norm(torch._foreach_sub(new, old))]
        out, parts = {}, defaultdict(lambda: defaultdict(list))
        prefixes = self._block_prefixes()
        for name, o, d in zip(names, old_norms, delta_norms, strict=True):
            i, p = params[name]
            if self.layout.kinds[id(p)] == "matrix":
                rest = name[len(prefixes[int(i)]) :] if prefixes[int(i)] else name
                out[f"update/ratio/layer_{i}/{rest.removesuffix('.weight')}"] = d / o
                parts[i]["matrices"].append((d, o))
            else:
                parts[i]["gains"].append((d, o))
        for i, groups in parts.items():
            for group, pairs in groups.items():
                delta = torch.linalg.vector_norm(torch.stack([d for d, _ in pairs]))
                size = torch.linalg.vector_norm(torch.stack([o for _, o in pairs]))
                if group == "matrices":
                    out[f"param/norm/layer_{i}"] = size
                    out[f"update/ratio/layer_{i}"] = delta / size
                else:
                    out[f"update/ratio/layer_{i}/gains"] = delta / size
        return out

    def _block_prefixes(self) -> list[str]:
        """Each block's parameter-name prefix in the model ('layers.3.', 'model.layers.3.')."""
        names = {id(m): n for n, m in self.model.named_modules()}
        return [names[id(b)] + "." if names.get(id(b)) else "" for b in self.layout.blocks]

    def finish(self) -> dict[str, float]:
        """Remove the hooks and return every metric as a float, read back with one device sync."""
        for h in self.handles:
            h.remove()
        self.handles = []
        self._leave()
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
        pooled = over_ranks(pooled, maxima)  # each rank saw its share of the batch
        layers = defaultdict(list)
        for key in [k for k in pooled if k.startswith("energy/mean_sq/")]:
            # each norm's share of its inputs' energy in the mean direction: sum of mean(x)^2 over
            # sum of mean(x^2) (LN(x) = RMSNorm(x - mean(x)), whose square RMS is mean(x^2)(1 -
            # it)); a layer's: the mean of its norms' (scale-free: post-norm's two norms see
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
        for i, norms in enumerate(self.layout.norms):
            gains = [n.weight for n in norms.values() if getattr(n, "weight", None) is not None]
            if gains:
                values[f"norm/gain/layer_{i}"] = torch.cat(
                    [full(g).detach().float().flatten() for g in gains]
                ).mean()
        self.values, self.sums, self.before = {}, defaultdict(list), {}
        self.grad_norms, self.grad_max = {}, {}
        keys = list(values)
        numbers = (
            torch.stack([values[k].float().reshape(()) for k in keys]).tolist() if keys else []
        )
        return dict(zip(keys, numbers, strict=True))
