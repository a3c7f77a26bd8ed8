"""The monitor as a Lightning Callback (lightning is imported only here):

    trainer = L.Trainer(callbacks=[StabilityCallback(every=25)], ...)

Lightning calls `on_before_optimizer_step` before it clips, with the step's whole (accumulated)
gradients: the per-layer norms are read there. Each probed step's metrics go to the Trainer's own
loggers (TensorBoard, CSV, W&B ...) at its global step, and to <out>/metrics.jsonl when `out` is
given."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import Callback

from normlab.layout import Layout
from normlab.monitor import Every
from normlab.probe import StabilityProbe
from normlab.sinks import JsonlSink


class StabilityCallback(Callback):
    def __init__(self, every: int = 25, out=None, layout: Layout | None = None):
        self.cadence, self.out, self.layout = Every(every), out, layout
        self.probe: StabilityProbe | None = None
        self.active = False
        self.sink = None

    def on_train_start(self, trainer, pl_module):
        if self.probe is None:
            self.probe = StabilityProbe(pl_module, layout=self.layout)
        if self.out is not None and trainer.is_global_zero:
            self.sink = JsonlSink(Path(self.out) / "metrics.jsonl")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step + 1  # the optimizer step this batch belongs to
        if not self.active and self.cadence.due(step):
            self.active, self.step = True, step
            self.probe.snapshot()
            self.probe.attach(logits=True)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.active:  # before Lightning clips
            self.probe.record_grads(others=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.active or trainer.global_step < self.step:
            return  # an accumulating micro-batch: the step is not over
        self.active = False
        metrics = self.probe.finish()
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        if self.sink is not None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            extra = {"train/loss": float(loss)} if loss is not None else {}
            self.sink.write(trainer.global_step, {**extra, **metrics})

    def on_train_end(self, trainer, pl_module):
        if self.sink is not None:
            self.sink.close()
