"""Where the monitor's records go: a metrics.jsonl file (normlab's run format), TensorBoard event
files, W&B. Each sink has write(step, metrics) and close(); none of them stops training when it
fails (the Monitor warns and drops it)."""

from __future__ import annotations

import math
from pathlib import Path

from normlab.files import record_line

STEP = "train/step"  # the x axis of every W&B chart


class JsonlSink:
    """Appends one line per record to `path` (metrics.jsonl), flushed at once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a")

    def write(self, step: int, metrics: dict) -> None:
        self.file.write(record_line(step, metrics))
        self.file.flush()

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()


class TensorBoardSink:
    """TensorBoard event files in `logdir` (`tensorboard --logdir` its parent lists it as a run).
    `purge_step`: a resumed run's first step; events at or after it from the run before are
    hidden."""

    def __init__(self, logdir: str | Path, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                f"TensorBoard event files need the tensorboard package ({e}): pip install "
                "tensorboard"
            ) from None
        self.writer = SummaryWriter(str(logdir), purge_step=purge_step or None)

    def write(self, step: int, metrics: dict) -> None:
        for key, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                if math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
                else:  # a divergence shows as its own point
                    self.writer.add_scalar(key, float("nan"), step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """An initialized W&B run: every chart's x axis is our step, logged as a value (W&B drops
    records at or below the last step it received, so a resumed run's re-trained steps would never
    reach the dashboard under its own step)."""

    def __init__(self, run):
        self.run = run
        run.define_metric(STEP)
        run.define_metric("*", step_metric=STEP)

    def write(self, step: int, metrics: dict) -> None:
        self.run.log({STEP: step, **metrics})

    def close(self, summary: dict | None = None) -> None:
        if summary:
            self.run.summary.update({k: v for k, v in summary.items() if v is not None})
        self.run.finish()
