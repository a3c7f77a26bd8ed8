"""One optimizer step, and the cadence of everything else the loop does (evals, checkpoints,
probes)."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from normlab.dist import full
from training import distributed
from training.controls import Controls, controls_for
from training.flops import flops_per_token, peak_flops
from training.monitor import is_finite
from training.optim import build_optimizer, set_lr
from training.parallel import no_sync


@dataclass
class Every:
    """Due every n-th step (steps count from 1), at step `last` if given, and at step 1 if `first`;
    n = 0 turns the periodic part off (a checkpoint then happens only at the end, a probe never)."""

    n: int
    last: int | None = None
    first: bool = False

    def due(self, step: int) -> bool:
        return step == self.last or (
            self.n > 0 and (step % self.n == 0 or self.first and step == 1)
        )


@dataclass(kw_only=True)
class StepParts:
    """What one optimizer step needs: the model three ways (bare for clipping, DDP-wrapped for
    no_sync, and possibly compiled), its optimizer and how the global batch splits. Built by keyword
    (fifteen fields, several of one type: a positional call would swap two without an error)."""

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
    # float16 autocast: dynamic loss scaling (scaler_for); disabled, its scale, unscale_ and update
    # do nothing and its step is the optimizer's
    scaler: torch.amp.GradScaler = field(
        default_factory=lambda: torch.amp.GradScaler(enabled=False)
    )
    controls: Controls | None = None  # skip-step, update clipping, QK-Clip (training/controls.py)
    flops_per_step: float = 0.0  # model FLOPs of one optimizer step (training/flops.py)
    peak_flops: float | None = None  # per device; known: train/mfu is logged


AUTOCAST_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast_for(device: torch.device, dtype: str):
    """The autocast context of train.dtype (disabled for float32)."""
    low = AUTOCAST_DTYPES[dtype]
    return torch.autocast(device.type, dtype=low or torch.bfloat16, enabled=low is not None)


def scaler_for(device: torch.device, dtype: str) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for float16: its gradients underflow without loss scaling
    (bfloat16 has float32's range and needs none). Disabled, it passes everything through
    unchanged."""
    return torch.amp.GradScaler(device.type, enabled=dtype == "float16")


@dataclass
class StepResult:
    """What one optimizer step reports: its metrics record, and whether it diverged (a non-finite
    loss or gradient norm: no update was made, and the run ends)."""

    record: dict
    diverged: bool = False


class NoProbe:
    """The probe on the steps it is not due: observes nothing (the step runs compiled, if it is)."""

    eager = False

    def attach(self) -> None: ...
    def record_logits(self, logits: torch.Tensor) -> None: ...
    def record_grads(self) -> None: ...
    def snapshot(self) -> None: ...

    def finish(self) -> dict:
        return {}


NO_PROBE = NoProbe()


def train_step(
    p: StepParts, batch: tuple[torch.Tensor, torch.Tensor], lr: float, probe=NO_PROBE
) -> StepResult:
    """Forward and backward over the micro-batches of `batch`, clip, and update with learning rate
    `lr`. A due probe's hooks observe this step (its per-layer metrics join the record)."""
    t0 = time.perf_counter()
    scaler, scaling = p.scaler, p.scaler.is_enabled()
    set_lr(p.opt, lr)  # times each group's multiplier (training/optim.py param_groups)
    x, y = batch
    probe.attach()
    forward = p.ddp if probe.eager else p.compiled  # hooks run eagerly, outside torch.compile
    loss_sum = torch.zeros((), device=p.device)
    log_z2_sum = torch.zeros((), device=p.device)  # z-loss: mean log(Z)^2 of each micro-batch
    for i, (xm, ym) in enumerate(zip(x.split(p.micro), y.split(p.micro), strict=True)):
        # DDP all-reduces gradients only on the last micro-batch
        sync = nullcontext() if i == p.accum - 1 or p.world_size == 1 else no_sync(p.ddp)
        with sync:
            with p.autocast:
                logits, loss = forward(xm.to(p.device), ym.to(p.device))
            probe.record_logits(logits)
            total = loss
            if p.z_loss:  # of the logits the loss saw (soft-capped, when model.logit_softcap is on)
                log_z2 = torch.logsumexp(logits.float(), -1).pow(2).mean()
                total = total + p.z_loss * log_z2
                log_z2_sum += log_z2.detach()
            scaler.scale(total / p.accum).backward()
        loss_sum += loss.detach()
    scaler.unscale_(p.opt)  # true gradients from here on (probe, clipping)
    probe.record_grads()  # before clipping, like the global norm
    # sharded: the global norm
    grad_norm = full(torch.nn.utils.clip_grad_norm_(p.model.parameters(), p.clip))
    train_loss, log_z2 = (
        distributed.all_reduce(torch.stack([loss_sum, log_z2_sum]) / p.accum) / p.world_size
    )
    loss_value, norm_value, log_z2_value = torch.stack(
        [train_loss.float(), grad_norm.float(), log_z2.float()]
    ).tolist()  # one sync
    record = {"train/loss": loss_value, "train/lr": lr, "grad/norm": norm_value}
    # the z term apart from the cross-entropy (train/loss): raw, and as added to the objective
    if p.z_loss:
        record.update({"train/log_z2": log_z2_value, "train/z_loss": p.z_loss * log_z2_value})
    # float16: gradients that overflow at the current scale (a finite loss, a non-finite gradient
    # norm, the scale still >= 1) are not a divergence: the step is skipped (GradScaler's step()
    # sees the infs unscale_ found) and the scale halves. float32 and bfloat16: a non-finite
    # gradient is a divergence, never an overflow
    overflow = (
        scaling and is_finite(loss_value) and not is_finite(norm_value) and scaler.get_scale() >= 1
    )
    if scaling:
        record["amp/scale"] = scaler.get_scale()
    # stop before the optimizer sees a non-finite grad
    if not overflow and not is_finite(loss_value, norm_value):
        probe.finish()  # detach the hooks
        return StepResult(record, diverged=True)
    skipped = p.controls is not None and p.controls.before(
        p.model, p.opt, probe is not NO_PROBE, loss_value, norm_value, record
    )
    if not overflow:
        probe.snapshot()  # parameters before the update, for update/ratio
    if not skipped:
        scaler.step(p.opt)  # disabled: p.opt.step()
    scaler.update()
    if p.controls is not None:
        p.controls.after(p.model, record)
    if scaling:
        record["amp/skipped"] = float(overflow)
    p.opt.zero_grad(set_to_none=True)
    metrics = probe.finish()
    if not overflow:
        record["grad/clipped"] = float(norm_value > p.clip)
        record.update(metrics)
    dt = time.perf_counter() - t0
    record["train/tokens_per_s"] = p.tokens_per_step / dt
    if p.peak_flops:  # model FLOPs utilization of each device
        record["train/mfu"] = p.flops_per_step / dt / (p.peak_flops * p.world_size)
    return StepResult(record)


def step_parts(cfg, d, model: torch.nn.Module, wrapped: torch.nn.Module, split: tuple[int, int]):
    """A run's StepParts: its model (bare, wrapped or sharded, compiled when train.compile), a fresh
    optimizer, the batch split (micro, accum) and the precision of train.dtype."""
    tc, cuda = cfg.train, d.device.type == "cuda"
    tokens = tc.batch_size * tc.seq_len
    return StepParts(
        model=model,
        ddp=wrapped,
        compiled=torch.compile(wrapped) if tc.compile else wrapped,
        opt=build_optimizer(model, cfg.optim),
        micro=split[0],
        accum=split[1],
        world_size=d.world_size,
        device=d.device,
        autocast=autocast_for(d.device, tc.dtype),
        z_loss=tc.z_loss,
        clip=no_clip(cfg.optim.grad_clip),
        tokens_per_step=tokens,
        scaler=scaler_for(d.device, tc.dtype),
        controls=controls_for(model, cfg.optim),
        flops_per_step=flops_per_token(cfg.model, tc.seq_len) * tokens,
        peak_flops=peak_flops(torch.cuda.get_device_name(d.device), tc.dtype) if cuda else None,
    )


def no_clip(value: float) -> float:
    """optim.grad_clip = 0 means no clipping (the norm is still measured)."""
    return value or math.inf
