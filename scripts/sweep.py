"""Run a study: train a grid of configs in parallel workers, then write its report (study/cli.py;
--help)."""

import sys

from study.cli import sweep

if __name__ == "__main__":
    sys.exit(sweep(sys.argv[1:]))
