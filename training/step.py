"""One optimizer step, and the cadence of everything else the loop does (evals, checkpoints, probes)."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from training import distributed
from training.monitor import is_finite
from training.parallel import full, no_sync


@dataclass
class Every:
    """Due every n-th step (steps count from 1), at step `last` if given, and at step 1 if `first`; n = 0 turns
    the periodic part off (a checkpoint then happens only at the end, a probe never)."""

    n: int
    last: int | None = None
    first: bool = False

    def due(self, step: int) -> bool:
        return step == self.last or (self.n > 0 and (step % self.n == 0 or self.first and step == 1))


@dataclass
class StepParts:
    """What one optimizer step needs: the model three ways (bare for clipping, DDP-wrapped for no_sync, and
    possibly compiled), its optimizer and how the global batch splits."""

    model: torch.nn.Module
    ddp: torch.nn.Module
    compiled: torch.nn.Module
    opt: torch.optim.Optimizer
    micro: int  # sequences per forward pass
    accum: int  # micro-batches per step
    world_size: int
    device: torch.device
    autocast: object
    z_loss: float
    clip: float  # max global grad norm (inf: no clipping)
    tokens_per_step: int
    scaler: torch.amp.GradScaler | None = None  # float16 autocast: dynamic loss scaling; None or disabled: off
    flops_per_step: float = 0.0  # model FLOPs of one optimizer step (training/flops.py)
    peak_flops: float | None = None  # per device; known: train/mfu is logged


AUTOCAST_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast_for(device: torch.device, dtype: str):
    """The autocast context of train.dtype (disabled for float32)."""
    low = AUTOCAST_DTYPES[dtype]
    return torch.autocast(device.type, dtype=low or torch.bfloat16, enabled=low is not None)


def scaler_for(device: torch.device, dtype: str) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for float16: its gradients underflow without loss scaling (bfloat16 has
    float32's range and needs none). Disabled, it passes everything through unchanged."""
    return torch.amp.GradScaler(device.type, enabled=dtype == "float16")


def train_step(p: StepParts, batch: tuple[torch.Tensor, torch.Tensor], lr: float, probe=None) -> dict:
    """Forward and backward over the micro-batches of `batch`, clip, and update with learning rate `lr`; the step's
    metrics record. With a probe, its hooks observe this step (per-layer metrics join the record). A non-finite
    loss or gradient norm makes no update and returns the record with diverged=True."""
    t0 = time.perf_counter()
    scaler = p.scaler if p.scaler is not None and p.scaler.is_enabled() else None
    for group in p.opt.param_groups:
        group["lr"] = lr
    x, y = batch
    if probe is not None:
        probe.attach()
    forward = p.ddp if probe is not None else p.compiled  # hooks run eagerly, outside torch.compile
    loss_sum = torch.zeros((), device=p.device)
    for i, (xm, ym) in enumerate(zip(x.split(p.micro), y.split(p.micro), strict=True)):
        # DDP all-reduces gradients only on the last micro-batch
        sync = nullcontext() if i == p.accum - 1 or p.world_size == 1 else no_sync(p.ddp)
        with sync:
            with p.autocast:
                logits, loss = forward(xm.to(p.device), ym.to(p.device))
            if probe is not None:
                probe.record_logits(logits)
            total = loss
            if p.z_loss:
                total = total + p.z_loss * torch.logsumexp(logits.float(), -1).pow(2).mean()
            (scaler.scale(total / p.accum) if scaler else total / p.accum).backward()
        loss_sum += loss.detach()
    if scaler:
        scaler.unscale_(p.opt)  # true gradients from here on (probe, clipping)
    if probe is not None:
        probe.record_grads()  # before clipping, like the global norm
    grad_norm = full(torch.nn.utils.clip_grad_norm_(p.model.parameters(), p.clip))  # sharded: the global norm
    train_loss = distributed.all_reduce(loss_sum / p.accum) / p.world_size
    loss_value, norm_value = torch.stack([train_loss.float(), grad_norm.float()]).tolist()  # one sync
    record = {"train/loss": loss_value, "train/lr": lr, "grad/norm": norm_value}
    if scaler:
        record["amp/scale"] = scaler.get_scale()
    # float16: gradients that overflowed at this loss scale are not a divergence; the scaler skips the update
    # (its step() sees the infs unscale_ found) and halves the scale
    overflow = bool(scaler) and is_finite(loss_value) and not is_finite(norm_value) and scaler.get_scale() >= 1
    if not overflow and not is_finite(loss_value, norm_value):  # stop before the optimizer sees a non-finite grad
        if probe is not None:
            probe.finish()  # detach the hooks
        return {**record, "diverged": True}
    if probe is not None and not overflow:
        probe.snapshot()  # parameters before the update, for update/ratio
    if scaler:
        record["amp/skipped"] = float(overflow)
        scaler.step(p.opt)
        scaler.update()
    else:
        p.opt.step()
    p.opt.zero_grad(set_to_none=True)
    metrics = probe.finish() if probe is not None else {}
    if not overflow:
        record["grad/clipped"] = float(norm_value > p.clip)
        record.update(metrics)
    dt = time.perf_counter() - t0
    record["train/tokens_per_s"] = p.tokens_per_step / dt
    if p.peak_flops:  # model FLOPs utilization of each device
        record["train/mfu"] = p.flops_per_step / dt / (p.peak_flops * p.world_size)
    return {**record, "diverged": False}


def no_clip(value: float) -> float:
    """optim.grad_clip = 0 means no clipping (the norm is still measured)."""
    return value or math.inf
