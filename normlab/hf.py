"""The monitor in transformers' Trainer. Add it to a built Trainer (it must run before the Trainer's
reporters, so that its metrics reach them: TensorBoard, W&B, ...):

    trainer = Trainer(model=model, args=args, train_dataset=data)
    add_monitor(trainer)                  # probes on the Trainer's logging steps
    trainer.train()                       # python -m normlab.inspect <output_dir>

Per-layer gradient norms are taken from gradient hooks as the gradients accumulate: before the
Trainer clips them (it clips before `on_pre_optimizer_step`), so their root-sum-square is the
Trainer's own `grad_norm`. Each probed step's metrics join the Trainer's next log (its
`log_history` too) and <output_dir>/normlab/metrics.jsonl, with the Trainer's loss, grad_norm,
learning rate and eval loss under normlab's names (train/loss, grad/norm, train/lr, val/loss);
summary.json there has the loss spikes by step. transformers is imported only here."""

from __future__ import annotations

import json
import math
from pathlib import Path

from transformers import TrainerCallback

from normlab.files import write_text
from normlab.layout import Layout
from normlab.probe import StabilityProbe
from normlab.sinks import JsonlSink
from normlab.spikes import SpikeDetector

# the Trainer's log keys in normlab's names
NAMES = {
    "loss": "train/loss",
    "grad_norm": "grad/norm",
    "learning_rate": "train/lr",
    "eval_loss": "val/loss",
}


class NormlabCallback(TrainerCallback):
    """The monitor as a TrainerCallback (add it with add_monitor, first in line). `every`: probe
    every n-th optimizer step (default: the Trainer's logging_steps); `out`: the folder of its
    metrics.jsonl (default: <output_dir>/normlab)."""

    def __init__(self, every: int | None = None, out=None, layout: Layout | None = None):
        self.every, self.out, self.layout = every, out, layout
        self.probe: StabilityProbe | None = None
        self.pending: tuple[int, dict] | None = None
        self.active = False
        self.sink: JsonlSink | None = None
        self.detector = SpikeDetector()
        self.spikes: list[int] = []
        self.added: tuple = ()  # the keys it added to the last log

    def _cadence(self, args, state) -> int:
        if self.every is not None:
            return self.every
        n = args.logging_steps
        if n < 1:  # a ratio of the run's steps
            n = math.ceil(state.max_steps * n)
        return max(1, int(n))

    def due(self, args, state, step: int) -> bool:
        return step % self._cadence(args, state) == 0 or (step == 1 and args.logging_first_step)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.probe is None:
            self.probe = StabilityProbe(model, layout=self.layout)
        if state.is_world_process_zero:
            folder = Path(self.out or Path(args.output_dir) / "normlab")
            self.sink = JsonlSink(folder / "metrics.jsonl")

    def on_step_begin(self, args, state, control, **kwargs):
        self._flush()
        step = state.global_step + 1
        self.active = self.probe is not None and self.due(args, state, step)
        if self.active:
            self.probe.snapshot()
            self.probe.attach(logits=True, grads=True)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.active:  # the hooked norms: before the clip the Trainer has already made
            self.probe.record_grads(others=True)

    def on_step_end(self, args, state, control, **kwargs):
        if not self.active:
            return
        self.active = False
        self.pending = (state.global_step, self.probe.finish())

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs if logs is not None else {}
        self.added = ()
        record = {NAMES[k]: v for k, v in logs.items() if k in NAMES}
        if self.pending is not None and self.pending[0] == state.global_step and "loss" in logs:
            metrics = self.pending[1]
            self.pending = None
            logs.update(metrics)  # the reporters after this callback see them
            self.added = tuple(metrics)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(metrics)
            record.update(metrics)
        loss = record.get("train/loss")
        if loss is not None and self.detector.update(float(loss)):
            self.spikes.append(state.global_step)
            record["spike/loss"] = 1.0
        if record and self.sink is not None:
            self.sink.write(state.global_step, record)

    def _flush(self) -> None:
        """A probed step the Trainer did not log: its metrics go to metrics.jsonl alone."""
        if self.pending is not None and self.sink is not None:
            self.sink.write(*self.pending)
        self.pending = None

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()
        if self.sink is None:
            return
        self.sink.close()
        summary = {
            "steps": state.global_step,
            "spikes/loss": self.spikes,
            "spike_score/loss": self.detector.score,
            "source": "transformers.Trainer",
        }
        write_text(self.sink.path.parent / "summary.json", json.dumps(summary, indent=1) + "\n")


class _Quiet(TrainerCallback):
    """Takes the monitor's metrics out of a log before the console's progress callback prints it
    (the reporters before it have them; the console keeps the Trainer's own few numbers)."""

    def __init__(self, monitor: NormlabCallback):
        self.monitor = monitor

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key in self.monitor.added:
            (logs or {}).pop(key, None)


def add_monitor(trainer, every: int | None = None, out=None, layout: Layout | None = None):
    """Put a NormlabCallback first among `trainer`'s callbacks (before its reporters, so they log
    its metrics) and keep its metrics off the console; the callback."""
    callback = NormlabCallback(every, out, layout)
    callbacks = trainer.callback_handler.callbacks
    console = next(
        (i for i, c in enumerate(callbacks) if type(c).__name__.endswith(("Progress", "Printer",
         "ProgressCallback", "PrinterCallback"))),
        len(callbacks),
    )  # fmt: skip
    callbacks.insert(console, _Quiet(callback))
    callbacks.insert(0, callback)
    return callback
