"""One log(step, metrics) API: metrics.jsonl always, TensorBoard event files (log.tensorboard), the
progress bar, and wandb when enabled; the sinks are the library's (normlab/sinks.py). Progress and
results go to stdout, warnings to stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from normlab.sinks import JsonlSink, TensorBoardSink, WandbSink
from training.rundir import RunDir, write_text


class Logger:
    """Writes every record to metrics.jsonl (and TensorBoard event files in the run directory);
    shows loss / lr / tokens per second on a tqdm bar; mirrors records to wandb (offline or online)
    when asked, and never lets a TensorBoard or wandb failure stop training."""

    def __init__(
        self,
        run_dir: Path | None,
        name: str,
        total_steps: int,
        start_step: int = 0,
        wandb_mode: str = "disabled",
        wandb_project: str = "normlab",
        config: dict | None = None,
        tensorboard: bool = False,
    ):
        self.enabled = run_dir is not None  # only the master process logs
        run = RunDir(run_dir) if self.enabled else None
        self.jsonl = JsonlSink(run.metrics) if self.enabled else None
        self.sinks: list = []
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
        if self.enabled and tensorboard:
            # events beside metrics.jsonl: `tensorboard --logdir runs` lists each run by its name;
            # a resumed run hides the events it logged after the checkpoint it resumes from
            self._add(lambda: TensorBoardSink(run_dir, purge_step=start_step), "TensorBoard")
        if self.enabled and wandb_mode != "disabled":

            def start():
                import wandb  # only imported when asked for

                return WandbSink(
                    wandb.init(
                        project=wandb_project,
                        name=name,
                        dir=str(run_dir),
                        mode=wandb_mode,
                        config=config,
                        resume="allow",
                        id=_wandb_id(run),
                    )
                )

            self._add(start, "wandb")

    def _add(self, make, what: str) -> None:
        try:
            self.sinks.append(make())
        except Exception as e:
            self.warn(f"{what} disabled: {str(e).strip().splitlines()[0][:200] if str(e) else e!r}")

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self.jsonl.write(step, metrics)
        if "train/loss" in metrics:
            self.bar.set_postfix_str(
                f"loss {metrics['train/loss']:.4f} lr {metrics['train/lr']:.2e} "
                f"tok/s {metrics.get('train/tokens_per_s', 0):,.0f}",
                refresh=False,
            )
            self.bar.update(step - self.bar.n)
        for sink in list(self.sinks):
            try:
                sink.write(step, metrics)
            except Exception as e:
                self.warn(f"{_what(sink)} logging stopped: {e}")
                self.sinks.remove(sink)

    def message(self, text: str) -> None:
        """A line of the run's progress or result: stdout (`python train.py > log.txt` keeps it)."""
        if self.enabled:
            tqdm.write(text, file=sys.stdout)

    def warn(self, text: str) -> None:
        """A warning: stderr, above the progress bar."""
        if self.enabled:
            tqdm.write(text, file=sys.stderr)

    def close(self, summary: dict | None = None) -> None:
        """Close the bar, the metrics file, TensorBoard and wandb (with the summary); a second
        call does nothing."""
        if not self.enabled or self.jsonl.file.closed:
            return
        self.bar.close()
        self.jsonl.close()
        for sink in self.sinks:
            try:
                sink.close(summary) if isinstance(sink, WandbSink) else sink.close()
            except Exception as e:
                self.warn(f"{_what(sink)} finish failed: {e}")
        self.sinks = []


def _what(sink) -> str:
    return "wandb" if isinstance(sink, WandbSink) else "TensorBoard"


def _wandb_id(run: RunDir) -> str:
    """A stable wandb run id per run directory, so a resumed run continues the same wandb run."""
    path = run.wandb_id
    if not path.exists():
        import uuid

        write_text(path, uuid.uuid4().hex[:12])
    return path.read_text().strip()
