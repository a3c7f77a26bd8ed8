"""One log(step, metrics) API: metrics.jsonl always, the progress bar, and wandb when enabled.
Progress and results go to stdout, warnings to stderr."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tqdm import tqdm

from training.rundir import RunDir, write_text

STEP = "train/step"  # the x axis of every wandb chart


def _clean(v):
    """JSON has no NaN / inf: non-finite numbers are written as null (the run's summary says
    why)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class Logger:
    """Writes every record to metrics.jsonl; shows loss / lr / tokens per second on a tqdm bar;
    mirrors records to wandb (offline or online) when asked, and never lets a wandb failure stop
    training."""

    def __init__(
        self,
        run_dir: Path | None,
        name: str,
        total_steps: int,
        start_step: int = 0,
        wandb_mode: str = "disabled",
        wandb_project: str = "normlab",
        config: dict | None = None,
    ):
        self.enabled = run_dir is not None  # only the master process logs
        run = RunDir(run_dir) if self.enabled else None
        self.file = open(run.metrics, "a") if self.enabled else None
        tty = sys.stdout.isatty()
        self.bar = tqdm(
            file=sys.stdout,
            total=total_steps,
            initial=start_step,
            desc=name,
            unit="step",
            disable=not (self.enabled and tty),  # a file or pipe gets the lines, not a bar
            dynamic_ncols=True,
            mininterval=0.5,
        )
        self.wandb = None
        if self.enabled and wandb_mode != "disabled":
            try:
                import wandb  # only imported when asked for

                self.wandb = wandb.init(
                    project=wandb_project,
                    name=name,
                    dir=str(run_dir),
                    mode=wandb_mode,
                    config=config,
                    resume="allow",
                    id=_wandb_id(run),
                )
                # Every chart's x axis is our step, logged as a value, never as wandb's own step:
                # wandb drops records at or below the last step it received, so after a crash and
                # --resume the re-trained steps (between the checkpoint and the crash) would never
                # reach the dashboard.
                self.wandb.define_metric(STEP)
                self.wandb.define_metric("*", step_metric=STEP)
            except Exception as e:
                self.warn(
                    f"wandb disabled: {str(e).strip().splitlines()[0][:200] if str(e) else e!r}"
                )

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self.file.write(
            json.dumps({"step": step, **{k: _clean(v) for k, v in metrics.items()}}) + "\n"
        )
        self.file.flush()
        if "train/loss" in metrics:
            self.bar.set_postfix_str(
                f"loss {metrics['train/loss']:.4f} lr {metrics['train/lr']:.2e} "
                f"tok/s {metrics.get('train/tokens_per_s', 0):,.0f}",
                refresh=False,
            )
            self.bar.update(step - self.bar.n)
        if self.wandb is not None:
            try:
                self.wandb.log({STEP: step, **metrics})  # wandb's own step just counts calls
            except Exception as e:
                self.warn(f"wandb logging stopped: {e}")
                self.wandb = None

    def message(self, text: str) -> None:
        """A line of the run's progress or result: stdout (`python train.py > log.txt` keeps it)."""
        if self.enabled:
            tqdm.write(text, file=sys.stdout)

    def warn(self, text: str) -> None:
        """A warning: stderr, above the progress bar."""
        if self.enabled:
            tqdm.write(text, file=sys.stderr)

    def close(self, summary: dict | None = None) -> None:
        """Close the bar, the metrics file and wandb (with the summary); a second call does
        nothing."""
        if not self.enabled or self.file.closed:
            return
        self.bar.close()
        self.file.close()
        if self.wandb is not None:
            try:
                if summary:
                    self.wandb.summary.update({k: v for k, v in summary.items() if v is not None})
                self.wandb.finish()
            except Exception as e:
                self.warn(f"wandb finish failed: {e}")


def _wandb_id(run: RunDir) -> str:
    """A stable wandb run id per run directory, so a resumed run continues the same wandb run."""
    path = run.wandb_id
    if not path.exists():
        import uuid

        write_text(path, uuid.uuid4().hex[:12])
    return path.read_text().strip()
