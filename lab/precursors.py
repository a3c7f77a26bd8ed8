"""The report's spike-precursor table (issue 43; exploratory, never a claim): per arm, for each
loss spike, which per-layer signal crossed its own robust threshold first and how many steps
before the loss (normlab/spikes.py finds them; a study that asks for precursors logs every
step)."""

from __future__ import annotations

import statistics

from normlab.spikes import FAMILIES, LOOKBACK, WINDOW, K, leads


def table(arms: dict[str, list]) -> list[str]:
    """The report's section: per arm (its runs' records and spike settings), the loss spikes, and
    per family the share of spikes it led (crossed before the loss), crossed with it (the same
    step) and its median lead; [] where no run has a spike and a signal."""
    rows = []
    for label, runs in arms.items():
        per_spike = [lead for run in runs for lead in leads(*run)]
        if not per_spike or not per_spike[0]:
            continue
        cells = []
        for family in FAMILIES:
            got = [d[family] for d in per_spike if family in d]
            if not got:
                cells.append("-")
                continue
            led = [v for v in got if v is not None and v >= 1]
            same = sum(v == 0 for v in got)
            median = f", median {statistics.median(led):g} steps" if led else ""
            cells.append(f"{len(led)}/{len(got)} led, {same} same step{median}")
        rows.append(f"| {label} | {len(per_spike)} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "## Spike precursors (exploratory)",
        "",
        "Per loss spike, which per-layer signal crossed its own threshold (median + "
        f"{K:g} robust sd of its last {WINDOW} values) first, up to {LOOKBACK} steps before the "
        "loss "
        "(lab/precursors.py): a signal read on stats steps leads by at most that cadence's "
        "resolution.",
        "",
        "| arm | loss spikes | " + " | ".join(FAMILIES) + " |",
        "|---|---|" + "---|" * len(FAMILIES),
        *rows,
        "",
    ]
