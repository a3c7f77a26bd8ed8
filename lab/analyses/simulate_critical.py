"""The paired critical-LR design, simulated before any run (issue 60): how often it says `agrees`
at true RMS / LN ratios 1, 1.1, 1.2 and 1.5, its wrong-verdict rate and its interval's coverage, by
seeds, seed-level noise and bisection resolution; and the seeds a power calculation asks for.

Model: seed s, arm k has a true critical LR c = c0 x ratio_k x exp(u_s + e_sk), u_s ~ N(0, 0.3^2)
shared by the arms (the seed decides most of it: the two norms shared each seed's outcome in 345 of
361 pairs), e_sk ~ N(0, sigma^2) the arm's own. Each seed is bisected (lab/critical.py next_lr) from
the bracket of a x3.16 grid, on its own offset grid (grid_offset), to the resolution; the estimate
is the bracket's geometric midpoint. Failure is deterministic given c (all 404 per-seed sequences of
the default study were monotone in the LR).

    python -m lab.analyses.simulate_critical            # writes lab/results/simulations/critical.md
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from lab.critical import bracket, compare, grid_offset, next_lr
from training.config import number
from training.rundir import write_text

OUT = Path(__file__).resolve().parents[1] / "results" / "simulations" / "critical.md"
BAND_OUT = OUT.with_name("critical-band.md")
RATIOS = (1.0, 1.1, 1.2, 1.5)
SEED_SD = 0.3  # the seed's shared log effect
GRID_STEP = 10**0.5  # the study grid's x3.16
FLOOR = 1e-4


def measure(
    c: float, seed: int, resolution: float, band: float = 0.0, rng=None
) -> tuple[float | None, int]:
    """(the bisection's estimate of critical LR c, the runs it took) for one seed and arm: the
    bracket of the seed's x3.16 grid (offset by grid_offset), then bisection to the resolution;
    None where the grid has no bracket (censored). With a band, each run fails where its LR is at
    least c x exp(N(0, band^2)), drawn per run: outcomes not monotone in the LR, as critical-lr-
    control found. Bisection cannot see it (each new LR lies inside the bracket, so its outcome
    narrows the bracket whichever it is): the estimate scatters instead; only a first bracket drawn
    upside down has no estimate (None)."""

    def fails(lr: float) -> bool:
        return lr >= c * (math.exp(rng.normal(0, band)) if band else 1.0)

    off = grid_offset(seed, GRID_STEP)
    grid = [FLOOR * off * GRID_STEP**k for k in range(9)]
    below, above = [g for g in grid if g < c], [g for g in grid if g >= c]
    if not below or not above:
        return None, 0
    outcomes = {max(below): fails(max(below)), min(above): fails(min(above))}
    while True:
        try:
            b = bracket(outcomes)
        except ValueError:
            return None, len(outcomes)
        lr = next_lr(b, resolution, grid[-1], grid[0])
        if lr is None:
            return b.estimate(), len(outcomes)
        outcomes[lr] = fails(lr)


def simulate(
    n: int, sigma: float, ratio: float, resolution: float, sims: int, margin: float, rng, band=0.0
):
    """(P(agrees), P(differs), coverage of the ratio's 95% CI, mean runs per seed and arm, mean
    paired log sd)."""
    verdicts, covered, runs, sds = {"agrees": 0, "differs": 0, "inconclusive": 0}, 0, 0, []
    for _ in range(sims):
        u = rng.normal(0, SEED_SD, n)
        est = {}
        for arm, r in (("a", ratio), ("b", 1.0)):
            est[arm] = {}
            for s in range(n):
                c = 0.01 * r * math.exp(u[s] + rng.normal(0, sigma))
                est[arm][s], k = measure(c, s, resolution, band, rng)
                runs += k
        p = compare(est["a"], est["b"], margin)
        verdicts[p.verdict] += 1
        covered += p.ci[0] <= ratio <= p.ci[1]
        sds.append(p.sd)
    return (
        verdicts["agrees"] / sims,
        verdicts["differs"] / sims,
        covered / sims,
        runs / (2 * n * sims),
        float(np.mean(sds)),
    )


def band_table(sims: int, rng) -> list[str]:
    """The design again under the band critical-lr-control measured (outcomes not monotone in the
    LR): the seeds the 60-seed critical-lr and its 24-seed follow-ups ask for, at bands whose
    paired log sd brackets the measured 0.22 (positive control) and 0.30 (negative control)."""
    lines = [
        "",
        "## Under the band (after critical-lr-control)",
        "",
        "critical-lr-control found a seed's outcomes not monotone in the LR it trains at (10 of 12 "
        "seeds; paired log sd 0.30 where quantization alone gives ~0.05). Here each run fails "
        "where its LR is at least the seed's critical LR x exp(N(0, band^2)), drawn per run; "
        "sigma 0, "
        f"resolution x1.19, margin x1.1, {sims} simulated studies per row. `P(differs) at 1.2` is "
        "the instrument telling x1.2 from 1.",
        "",
        "| seeds | band | paired log sd at 1 | "
        + " | ".join(f"P(agrees) at {r:g}" for r in RATIOS)
        + " | P(differs) at 1 | P(differs) at 1.2 | coverage at 1 | coverage at 1.2 |",
        "| --- | --- | --- | " + " | ".join("---" for _ in RATIOS) + " | --- | --- | --- | --- |",
    ]
    for band in (0.15, 0.25):
        for n in (12, 24, 60):
            row = [simulate(n, 0.0, r, 1.19, sims, 1.1, rng, band) for r in RATIOS]
            lines.append(
                f"| {n} | {band:g} | {row[0][4]:.2f} | "
                + " | ".join(f"{x[0]:.2f}" for x in row)
                + f" | {row[0][1]:.2f} | {row[2][1]:.2f} | {row[0][2]:.2f} | {row[2][2]:.2f} |"
            )
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sims", type=number(int, ">= 10"), default=400)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--band", action="store_true", help=f"only the band table, to {BAND_OUT.name} beside --out"
    )
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    if a.band:
        out = a.out.with_name(BAND_OUT.name)
        head = ["# The paired critical-LR design under the band (simulate_critical.py --band)"]
        write_text(out, "\n".join(head + band_table(a.sims, rng)) + "\n")
        print(f"wrote {out}")
        return 0
    lines = [
        "# The paired critical-LR design, simulated (lab/analyses/simulate_critical.py)",
        "",
        f"{a.sims} simulated studies per row; margin x1.1 (TOST, alpha 0.05); seed effect sd "
        f"{SEED_SD} shared by the arms; sigma: each arm's own log noise per seed. Wrong verdict: "
        "`agrees` at a true ratio >= 1.2 or `differs` at 1.",
        "",
        "| seeds | sigma | resolution | "
        + " | ".join(f"P(agrees) at {r:g}" for r in RATIOS)
        + " | P(differs) at 1 | coverage at 1.2 | runs per seed and arm |",
        "| --- | --- | --- | " + " | ".join("---" for _ in RATIOS) + " | --- | --- | --- |",
    ]
    choice = []
    # P(agrees) >= 0.8 at 1, <= 0.05 at 1.2, and the 95% CI covering 1.2 in >= 93% of studies
    good = lambda row: row[0][0] >= 0.8 and row[2][0] <= 0.05 and row[2][2] >= 0.93  # noqa: E731
    for sigma in (0.0, 0.05, 0.1):
        for n in (6, 12, 24):
            for res in (1.19, 1.09):
                row = [simulate(n, sigma, r, res, a.sims, 1.1, rng) for r in RATIOS]
                if good(row) and not any(c[0] == sigma for c in choice):
                    choice.append((sigma, n, res))
                lines.append(
                    f"| {n} | {sigma:g} | x{res:g} | "
                    + " | ".join(f"{x[0]:.2f}" for x in row)
                    + f" | {row[0][1]:.2f} | {row[2][2]:.2f} | {row[0][3]:.1f} |"
                )
                print(lines[-1], flush=True)
    lines += [
        "",
        "The power calculation: the fewest seeds (then the coarser resolution) with P(agrees) >= "
        "0.8 at a true ratio of 1, <= 0.05 at 1.2, and the 95% CI covering the true ratio 1.2 in "
        ">= 93% of studies (at sigma 0 a x1.19 bisection puts both arms of most seeds in one cell: "
        "the t interval is then too narrow):",
        "",
    ]
    for sigma in (0.0, 0.05, 0.1):
        got = [f"{n} seeds at x{res:g}" for s_, n, res in choice if s_ == sigma]
        lines.append(f"- sigma {sigma:g}: {got[0] if got else 'none of these designs'}")
    write_text(a.out, "\n".join(lines) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
