"""Run a study: expand a grid of config values into runs, train them in parallel workers, write a report.

    python scripts/sweep.py configs/study.yaml [--workers N] [--out studies] [--dry-run] [--no-report]

A study file names a training config, overrides applied to every run, and a grid:

    name: norm-placement-lr          # the study directory: <out>/<name>/
    config: default.yaml             # training config, relative to this file
    overrides: {train: {steps: 500}} # applied to every run
    grid:                            # one run per combination; any config field (dotted), or the
      norm: [rmsnorm, layernorm]     # shorthands norm, placement, lr, seed
      lr: [1.0e-3, 1.0e-2]
      seed: [0, 1]
    threads_per_worker: 1            # CPU threads per run; workers = cores // threads (one per GPU on GPUs)

Runs live in <out>/<name>/runs/<run>/ (ordinary train.py run directories), their console output in
<out>/<name>/logs/<run>.log, and an index of every run's outcome in <out>/<name>/sweep.json. A rerun
skips finished runs and resumes interrupted or killed ones (every launch is train.py --resume); a diverged
run is a result and a failed run (a crash, bad input) is recorded with its one-line error, neither stops the
sweep. Ctrl-C or SIGTERM stops the runs in flight at a checkpoint and waits for them. At the end the report
(scripts/compare.py) is written.
"""

import sys

from study.cli import sweep

if __name__ == "__main__":
    sys.exit(sweep(sys.argv[1:]))
