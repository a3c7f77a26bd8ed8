"""Compare runs: read run directories (or study directories holding runs/) and write a stability report.

    python scripts/compare.py studies/norm-placement-lr [other run or study dirs...] [--out DIR]

Runs are grouped into arms by every config field that differs between them, except the learning rate
and the seed; the learning rate is the x axis and seeds give the spread. Writes report.md and PNG
figures into --out (default: the first directory). Reads only files; never a live process.

Per arm: best LR (lowest mean final val loss), the final val loss there (mean +- std over seeds), the
largest LR at which every seed finished `ok`, LR sensitivity (Wortsman et al. 2023: mean over the LR
grid of min(L(lr), L0) - L*, L0 the loss at initialization and L* the arm's best), outcome counts,
spike scores (OLMo 2, parameters as the runs logged them) and tokens/s.
"""

import sys

from study.cli import compare

if __name__ == "__main__":
    sys.exit(compare(sys.argv[1:]))
