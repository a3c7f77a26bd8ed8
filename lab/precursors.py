"""Spike precursors (issue 43; exploratory, never a claim): for each loss spike of a run, which
per-layer signal crossed its own robust threshold first, and how many steps before the loss.

A loss spike is a step training/monitor.py's SpikeDetector flags on train/loss (the run's own
log.spike_window and log.spike_k). A signal crosses at step t when its value exceeds the median
plus K robust standard deviations (1.4826 x the median absolute deviation) of its WINDOW values
before t; a family (update norm, RMS_t, attention-logit max, log Z) crosses at the earliest
crossing of any of its layers. A spike's lead for a family is s - t for the earliest crossing t in
[s - LOOKBACK, s] (0: the same step as the loss; none: no crossing). Signals are read where they
were logged: on stats steps (log.stats_every), so a lead is only as fine as that cadence; a study
that asks for precursors logs every step."""

from __future__ import annotations

import re
import statistics

from training.monitor import SpikeDetector

FAMILIES = {
    "update norm": re.compile(r"update/ratio/layer_\d+$"),
    "RMS_t": re.compile(r"optim/rms_t/layer_\d+$"),
    "attention-logit max": re.compile(r"attn/logit_max/layer_\d+$"),
    "log Z": re.compile(r"logits/log_z$"),
}
WINDOW = 20  # trailing values a signal's threshold is estimated from
K = 5.0  # robust standard deviations above the trailing median
LOOKBACK = 10  # steps before a spike a crossing may lead it by (RMS_t: 1-8, Wortsman et al.)


def loss_spikes(records: list[dict], window: int = 5, k: float = 5.0) -> list[int]:
    """The steps whose train/loss the run's spike detector flags (a non-finite loss, written as
    null, ends the run's losses: what follows a divergence is not a spike)."""
    detector, out = SpikeDetector(window, k), []
    for r in records:
        if "train/loss" in r and r["train/loss"] is None:
            break
        if "train/loss" in r and detector.update(float(r["train/loss"])):
            out.append(r["step"])
    return out


def crossings(values: list[tuple[int, float]], window: int = WINDOW, k: float = K) -> list[int]:
    """The steps at which a signal ((step, value) in step order) exceeds the median + k robust sd
    of its `window` values before; judged once `window` values are known."""
    out = []
    for i in range(window, len(values)):
        before = [v for _, v in values[i - window : i]]
        mid = statistics.median(before)
        mad = statistics.median(abs(v - mid) for v in before)
        if values[i][1] > mid + k * 1.4826 * mad and values[i][1] > mid:
            out.append(values[i][0])
    return out


def family_crossings(records: list[dict]) -> dict[str, list[int]]:
    """Per family, every step at which one of its signals crossed (sorted)."""
    keys = {key for r in records for key in r}
    out = {}
    for family, pattern in FAMILIES.items():
        steps: set[int] = set()
        for key in sorted(k for k in keys if pattern.match(k)):
            values = [(r["step"], float(r[key])) for r in records if key in r]
            steps.update(crossings(values))
        if any(pattern.match(k) for k in keys):
            out[family] = sorted(steps)
    return out


def leads(records: list[dict], window: int = 5, k: float = 5.0) -> list[dict[str, int | None]]:
    """One {family: lead in steps, or None} per loss spike of the run."""
    crossed = family_crossings(records)
    out = []
    for s in loss_spikes(records, window, k):
        out.append(
            {
                family: next((s - t for t in steps if s - LOOKBACK <= t <= s), None)
                for family, steps in crossed.items()
            }
        )
    return out


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
