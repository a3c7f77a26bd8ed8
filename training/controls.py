"""Stability controls around the optimizer step (issue 43), each as its source configures it.

    skip-step      OLMo-core's SkipStepOptimizer: skip the update of a step whose loss or global
                   grad norm lies more than `sigma` (6) standard deviations from the mean of the
                   last `window` (128) steps; decided only once max(20, window / 2) steps are seen.
    update clip    StableAdamW (Wortsman et al. 2023b, arXiv 2304.13013, Alg. 2): per parameter
                   tensor RMS_t = sqrt(mean(g_t^2 / max(v_t, eps^2))), v_t AdamW's second moment
                   after this step's gradient (bias-corrected: Wortsman et al. warm beta2 up from 0
                   instead, which makes v_1 = g_1^2 as the correction does), and the tensor's step
                   divided by max(1, RMS_t).
    QK-Clip        Kimi K2 (arXiv 2507.20534, Sec. 2.1): after a step, a head whose max attention
                   logit S exceeded tau (100) has its logits scaled by gamma = tau / S; with
                   grouped-query attention a key head is shared, so gamma goes to W_q's rows of that
                   head alone (the paper splits sqrt(gamma) between W_q and W_k of a head that owns
                   both); RoPE is linear, so the head's logits scale by gamma exactly.

train_step (training/step.py) calls `before` after clipping, `after` after the optimizer's step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from training import distributed
from training.parallel import is_sharded


@dataclass
class SkipStep:
    """Skip an update whose loss or grad norm is an outlier of the last `window` steps."""

    sigma: float = 6.0
    window: int = 128
    losses: deque = field(default_factory=deque)
    norms: deque = field(default_factory=deque)

    def skip(self, loss: float, grad_norm: float) -> bool:
        """Whether this step's update is skipped; every step (skipped or not) joins the window."""
        out = False
        if len(self.losses) >= max(20, self.window // 2):
            out = any(
                _z(value, history) > self.sigma
                for value, history in ((loss, self.losses), (grad_norm, self.norms))
            )
        for history, value in ((self.losses, loss), (self.norms, grad_norm)):
            history.append(value)
            while len(history) > self.window:
                history.popleft()
        return out


def _z(value: float, history) -> float:
    """|value - mean| / sd over history (sd with n - 1, as torch.std); a constant history: 0 for
    its own value, infinite for any other."""
    n = len(history)
    mean = sum(history) / n
    sd = math.sqrt(sum((h - mean) ** 2 for h in history) / (n - 1))
    if sd == 0:
        return 0.0 if value == mean else math.inf
    return abs(value - mean) / sd


def rms_t(opt: torch.optim.Optimizer) -> dict[nn.Parameter, torch.Tensor]:
    """StableAdamW's RMS_t of every parameter with a gradient, before opt.step(): its v_t from the
    stored second moment and this step's gradient, bias-corrected; a fresh state (v = 0) counts
    as step 1."""
    out = {}
    for group in opt.param_groups:
        beta2, eps = group["betas"][1], group["eps"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = opt.state.get(p, {})
            t = int(state["step"]) + 1 if "step" in state else 1
            g2 = p.grad.detach().float().pow(2)
            v = state.get("exp_avg_sq")
            v = (1 - beta2) * g2 if v is None else beta2 * v.float() + (1 - beta2) * g2
            v_hat = v / (1 - beta2**t)
            out[p] = (g2 / v_hat.clamp_min(eps * eps)).mean().sqrt()
    return out


def rms_t_by_layer(model: nn.Module, rms: dict) -> dict[str, float]:
    """optim/rms_t/layer_i: the RMS_t of block i's parameters taken as one tensor
    (sqrt(sum of numel x RMS_t^2 / numel)); the embedding, head and final norm under their own."""
    sums: dict[str, list[float]] = {}
    for name, p in model.named_parameters():
        if p not in rms:
            continue
        part = name.split(".")
        key = f"layer_{part[1]}" if part[0] == "layers" else part[0]
        s = sums.setdefault(key, [0.0, 0])
        s[0] += float(rms[p]) ** 2 * p.numel()
        s[1] += p.numel()
    return {f"optim/rms_t/{k}": math.sqrt(a / n) for k, (a, n) in sums.items()}


class UpdateClip:
    """StableAdamW's update clipping around any AdamW step: the parameters before it, each tensor's
    step scaled by 1 / max(1, RMS_t) after it (weight decay included: both move with the LR)."""

    def __init__(self):
        self.before: dict = {}
        self.factor: dict = {}

    def prepare(self, opt: torch.optim.Optimizer, rms: dict) -> float:
        """Remember the parameters to clip; the fraction of tensors whose step will shrink."""
        self.factor = {p: max(1.0, float(r)) for p, r in rms.items()}
        self.before = {p: p.detach().clone() for p, f in self.factor.items() if f > 1.0}
        return len(self.before) / max(1, len(self.factor))

    @torch.no_grad()
    def apply(self) -> None:
        for p, old in self.before.items():
            p.copy_(old + (p - old) / self.factor[p])
        self.before = {}


@torch.no_grad()
def qk_clip(model: nn.Module, tau: float) -> dict[str, float]:
    """QK-Clip after a step: per layer, each head whose recorded max logit (the largest over the
    data-parallel ranks) exceeds tau has W_q's rows (and bias) of that head times tau / max; the
    number of heads rescaled per layer."""
    out = {}
    for i, block in enumerate(model.layers):
        att = block.attention
        peak = att.max_logit
        if peak is None:
            continue
        # data parallel: every rank saw its own batch; all rescale by the largest max (same weights)
        peak = distributed.all_reduce(peak.clone(), dist.ReduceOp.MAX)
        gamma = (tau / peak).clamp(max=1.0)  # (n_heads,)
        rescaled = int((gamma < 1).sum())
        if rescaled:
            rows = gamma.repeat_interleave(att.head_dim).to(att.wq.weight.dtype)
            att.wq.weight.mul_(rows[:, None])
            if att.wq.bias is not None:
                att.wq.bias.mul_(rows)
        out[f"qk_clip/rescaled/layer_{i}"] = float(rescaled)
        att.max_logit = None
    return out


@dataclass
class Controls:
    """The controls a run turned on (optim.*), called by train_step around the optimizer step."""

    skip: SkipStep | None = None
    clip: UpdateClip | None = None
    qk_tau: float = 0.0

    def before(self, model, opt, probe_due: bool, loss: float, norm: float, record: dict) -> bool:
        """After clipping, before the update: whether to skip it; RMS_t where clipping updates or
        the probe is due (optim/rms_t/*), the share of tensors whose step shrinks."""
        if self.skip is not None:
            skipped = self.skip.skip(loss, norm)
            record["optim/skipped"] = float(skipped)
            if skipped:
                return True
        if self.clip is not None or probe_due:
            rms = rms_t(opt)
            record.update(rms_t_by_layer(model, rms))
            if self.clip is not None:
                record["optim/update_clipped"] = self.clip.prepare(opt, rms)
        return False

    def after(self, model, record: dict) -> None:
        """After the update (or its skip): clip each tensor's step, then QK-Clip."""
        if self.clip is not None:
            self.clip.apply()
        if self.qk_tau:
            record.update(qk_clip(model, self.qk_tau))


def controls_for(model: nn.Module, optim) -> Controls | None:
    """The run's Controls from its optim config; with every control off, one that only measures
    RMS_t on the probe's steps (a spike precursor in every run), None for a sharded model (its
    DTensor shards are not measured). QK-Clip asks each attention to record its heads' max
    logits."""
    if not (optim.skip_step_sigma or optim.update_clip or optim.qk_clip_tau):
        return None if is_sharded(model) else Controls()
    for block in model.layers:
        block.attention.track_max_logit = bool(optim.qk_clip_tau)
    return Controls(
        skip=SkipStep(optim.skip_step_sigma, optim.skip_step_window)
        if optim.skip_step_sigma
        else None,
        clip=UpdateClip() if optim.update_clip else None,
        qk_tau=optim.qk_clip_tau,
    )
