"""The monitor for a plain PyTorch loop: the probe on every `every`-th step, the scalars you log,
spikes of the loss and the gradient norm as they happen, and sinks (metrics.jsonl, TensorBoard,
W&B).

    monitor = Monitor(model, "runs/my-run")
    for step, (x, y) in enumerate(loader, start=1):
        with monitor.step(step):           # hooks on probed steps only; they only read
            loss = model(x, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            monitor.log(loss=loss)
    monitor.close()                        # summary.json; python -m normlab.inspect runs/my-run

Gradient norms are taken as each gradient is accumulated, so they are the norms before clipping
(with gradient accumulation, of the whole step's gradient). Under a float16 GradScaler or DDP call
`monitor.before_clip()` after `scaler.unscale_(opt)` (or backward): it reads the gradients then."""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from normlab.files import write_text
from normlab.layout import Layout
from normlab.probe import StabilityProbe
from normlab.sinks import JsonlSink, TensorBoardSink, WandbSink
from normlab.spikes import SpikeDetector

# what log(...) names mean in normlab's keys
ALIASES = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "grad/norm", "val_loss": "val/loss"}


class Every:
    """Due at step 1 and every n-th step (n = 0: never)."""

    def __init__(self, n: int):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"every={n!r}: a whole number of steps >= 0 (0: never probe)")
        self.n = n

    def due(self, step: int) -> bool:
        return self.n > 0 and (step == 1 or step % self.n == 0)


def _number(value) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().item())
    return float(value)


def total_norm(metrics: dict) -> float | None:
    """The global gradient norm from the per-part norms (their root-sum-square)."""
    parts = [v for k, v in metrics.items() if k.startswith("grad/norm/")]
    return math.sqrt(sum(v * v for v in parts)) if parts else None


class Monitor:
    """Stability metrics of any model in any loop (module docstring). `out`: a folder for
    metrics.jsonl and summary.json (and TensorBoard events, `tensorboard`: True, False, or None:
    when the package is installed); `wandb`: an initialized W&B run; `sinks`: more (write,
    close); `layout`: where things are (auto_layout(model) by default:
    normlab's model by its names, any other by find_layout)."""

    def __init__(
        self,
        model: nn.Module,
        out: str | Path | None = None,
        every: int = 25,
        layout: Layout | None = None,
        tensorboard: bool | None = None,
        wandb=None,
        sinks=(),
        spike_window: int = 5,
        spike_k: float = 5.0,
    ):
        self.probe = StabilityProbe(model, Every(every), layout=layout)
        self.out = Path(out) if out is not None else None
        self.sinks = list(sinks)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            self.sinks.append(JsonlSink(self.out / "metrics.jsonl"))
            if tensorboard or tensorboard is None and _has_tensorboard():
                self.sinks.append(TensorBoardSink(self.out))
        if wandb is not None:
            self.sinks.append(WandbSink(wandb))
        self.detectors = {
            "loss": SpikeDetector(spike_window, spike_k),
            "grad_norm": SpikeDetector(spike_window, spike_k),
        }
        self.spikes: dict[str, list[int]] = {"loss": [], "grad_norm": []}
        self.spike_window, self.spike_k = spike_window, spike_k
        self.current: int | None = None  # the step inside monitor.step(...)
        self.record: dict = {}
        self.probed = self.read = False
        self.last: int | None = None

    # -- the loop's three moments ----------------------------------------------------------------
    def start(self, step: int) -> None:
        """Before the step's first forward pass (steps count from 1)."""
        self.current, self.record = step, {}
        self.probed, self.read = self.probe.due(step), False
        if self.probed:
            self.probe.snapshot()  # the parameters the optimizer will update
            self.probe.attach(logits=True, grads=True)

    def before_clip(self) -> None:
        """Optional: read the gradients now (after GradScaler.unscale_, or after DDP's reduction)
        instead of as they accumulate."""
        if self.probed and not self.read:
            self.probe.grad_norms, self.probe.grad_max = {}, {}
            self.probe.record_grads(others=True)
            self.read = True

    def end(self) -> dict:
        """After the optimizer step: the step's record, written to every sink."""
        step = self.current
        if step is None:
            raise RuntimeError("Monitor.end() without Monitor.start(step)")
        record = dict(self.record)
        if self.probed:
            if not self.read:
                self.probe.record_grads(others=True)
            metrics = self.probe.finish()
            total = total_norm(metrics)
            if total is not None and "grad/norm" not in record:
                record["grad/norm"] = total
            record.update(metrics)
        self._spikes(step, record)
        self._write(step, record)
        self.current, self.last = None, step
        return record

    @contextmanager
    def step(self, step: int):
        """start(step) ... end() around one optimizer step; an error in the step removes the
        hooks and writes nothing."""
        self.start(step)
        try:
            yield self
        except BaseException:
            self.probe.finish()
            self.current = None
            raise
        self.end()

    def log(self, step: int | None = None, **scalars) -> None:
        """Scalars of the step (loss=, lr=, grad_norm=, val_loss= or any name: tensors are read);
        outside monitor.step(...), written at once at `step` (default: the last step)."""
        values = {ALIASES.get(k, k): _number(v) for k, v in scalars.items() if v is not None}
        if self.current is not None and step in (None, self.current):
            self.record.update(values)
            return
        at = step if step is not None else self.last
        if at is None:
            raise ValueError("Monitor.log: give step= outside monitor.step(...)")
        self._spikes(at, values)
        self._write(at, values)

    # -- spikes, sinks, summary ------------------------------------------------------------------
    def _spikes(self, step: int, record: dict) -> None:
        for name, key in (("loss", "train/loss"), ("grad_norm", "grad/norm")):
            value = record.get(key)
            if value is not None and self.detectors[name].update(float(value)):
                self.spikes[name].append(step)
                record[f"spike/{name}"] = 1.0

    def _write(self, step: int, record: dict) -> None:
        for sink in list(self.sinks):
            try:
                sink.write(step, record)
            except Exception as e:  # a sink never stops training
                print(f"normlab: {type(sink).__name__} stopped: {e}", file=sys.stderr)
                self.sinks.remove(sink)

    def summary(self) -> dict:
        """The spikes so far, by step, and the spike scores (percent of judged steps)."""
        out = {}
        for name, detector in self.detectors.items():
            out[f"spikes/{name}"] = list(self.spikes[name])
            out[f"spike_score/{name}"] = detector.score
        return {**out, "spike_window": self.spike_window, "spike_k": self.spike_k}

    def close(self) -> dict:
        """Write summary.json (with `out`) and close the sinks; the summary."""
        import json

        summary = {"steps": self.last, **self.summary()}
        if self.out is not None:
            write_text(self.out / "summary.json", json.dumps(summary, indent=1) + "\n")
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                print(f"normlab: {type(sink).__name__} did not close: {e}", file=sys.stderr)
        self.sinks = []
        return summary


def _has_tensorboard() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None
