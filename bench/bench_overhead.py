"""Training-step time with stability metrics off, at the default interval, and at every step.

    python -m bench.bench_overhead [--config configs/train/default.yaml] [--steps 50] [--rounds 3]

Runs train.py itself (in this process), alternating the modes round by round so that machine noise
hits all of them alike, and sums the logged per-step times (eval, checkpoint and start-up excluded;
the first step is dropped as warm-up). Prints a markdown table of each mode's time relative to
"off": median over rounds and the min..max spread."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import train
from training.config import load_config, number
from training.rundir import RunDir


def step_seconds(run_dir: Path, tokens_per_step: int) -> float:
    """Total time of steps 2.. of a run, from its logged tokens/s."""
    return sum(
        tokens_per_step / r["train/tokens_per_s"]
        for r in RunDir(run_dir).records()
        if r["step"] > 1
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(train.DEFAULT_CONFIG))
    p.add_argument("--steps", type=number(int, ">= 1"), default=50)
    p.add_argument("--rounds", type=number(int, ">= 1"), default=3)
    p.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.overrides)
    modes = {
        "off": 0,
        f"every {cfg.log.stats_every} (default)": cfg.log.stats_every,
        "every step": 1,
    }
    tokens = cfg.train.batch_size * cfg.train.seq_len
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for mode, every in modes.items():
                name = f"r{r}-{every}"
                code = train.main(
                    [
                        "--config",
                        a.config,
                        "--name",
                        name,
                        f"log.out_dir={tmp}",
                        *a.overrides,
                        f"train.steps={a.steps}",
                        f"log.stats_every={every}",
                        "train.sample_tokens=0",
                        f"train.eval_every={a.steps}",
                        "train.checkpoint_every=0",
                    ]
                )
                if code != 0:
                    print(f"error: run {name} exited with {code}", file=sys.stderr)
                    return 1
                times[mode].append(step_seconds(Path(tmp) / name, tokens))
    print(
        f"\nStep time with stability metrics, relative to metrics off ({a.rounds} alternating "
        "rounds of "
        f"{a.steps - 1} steps, {Path(a.config).name}, {cfg.train.batch_size}x{cfg.train.seq_len} "
        "tokens/step)\n"
    )
    print("| metrics | s/step (median) | ratio to off: median | min..max |")
    print("|---|---|---|---|")
    for mode, ts in times.items():
        ratios = [t / off for t, off in zip(ts, times["off"], strict=True)]
        print(
            f"| {mode} | {statistics.median(ts) / (a.steps - 1):.4f} | "
            f"{statistics.median(ratios):.3f} | "
            f"{min(ratios):.3f}..{max(ratios):.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
