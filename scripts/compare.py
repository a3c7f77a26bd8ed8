"""Compare runs: read run or study directories and write a stability report (study/cli.py;
--help)."""

import sys

from study.cli import compare

if __name__ == "__main__":
    sys.exit(compare(sys.argv[1:]))
