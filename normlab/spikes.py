"""Spikes and what rose before them: a detector for upward spikes of a positive series (loss,
gradient norm), a run's spike score and spike steps, and the precursors of each loss spike (which
per-layer signal crossed its own robust threshold first, and how many steps before the loss).
Pure Python over logged records ({"step": ..., key: value}); no torch."""

from __future__ import annotations

import math
import re
import statistics
from collections import deque


class SpikeDetector:
    """Upward spikes of a positive series (loss, gradient norm), judged from the first steps and on
    a falling curve.

    Each value is compared, in log space, with the median of the `window` values before it: a local
    level, so the trend of a falling curve is removed and a lone spike barely moves it. The
    deviation d_t = log v_t - log median counts as a spike when it exceeds max(c, 0) by `k` robust
    standard deviations (c the median and 1.4826 x the median absolute deviation of the deviations
    before it: expanding from the start, the last 1000 at most, spikes left out), widened by
    (1 + 5/n) while that spread rests on few (n) deviations, and a 5% jump at least (a perfectly
    smooth curve has no spread to compare with). A spike rises above the local level (c < 0, a
    falling curve) or above a rising trend (c > 0). Judging starts once 5 deviations are known
    (step 7). OLMo 2's score (>= 7 std from a 1000-step trailing mean) judges nothing before its
    window fills and, on a falling curve, its std is the trend's, not the noise's."""

    HISTORY = 1000  # deviations the spread is estimated from (OLMo 2's window)
    FLOOR = math.log(1.05)

    def __init__(self, window: int = 5, k: float = 5.0):
        self.window, self.k = window, k
        self.recent: deque[float] = deque(maxlen=window)  # log values
        self.deviations: deque[float] = deque(maxlen=self.HISTORY)  # judged, not spikes
        self.seen = self.spikes = 0

    def update(self, value: float) -> bool:
        """Record `value`; True if it is a spike."""
        if not (math.isfinite(value) and value > 0):
            return False
        x, spike = math.log(value), False
        if len(self.recent) >= min(2, self.window):
            d = x - _median(self.recent)
            n = len(self.deviations)
            if n >= 5:
                center = _median(self.deviations)
                scale = 1.4826 * _median([abs(v - center) for v in self.deviations])
                # a spread from few deviations is uncertain: the threshold widens by (1 + 5/n) while
                # n is small; a spike rises above the local level, or above a rising trend, never
                # merely above a falling one (else a fast first descent, d ~ -0.1 a step, makes
                # every step of the flatter curve after it a "spike", none of them ever joining
                # the deviations: 542 of 1000 steps of one controls-2025 run)
                spike = d - max(center, 0.0) > max(self.k * scale * (1 + 5 / n), self.FLOOR)
                self.seen += 1
                self.spikes += spike
            if not spike:
                self.deviations.append(d)
        # a lone spike barely moves a median; a lasting jump becomes the new level
        self.recent.append(x)
        return spike

    @property
    def score(self) -> float | None:
        """Percentage of judged steps that were spikes (None before judging starts)."""
        return 100.0 * self.spikes / self.seen if self.seen else None


def _median(values) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def spike_score(values, window: int = 5, k: float = 5.0) -> float | None:
    """The spike score of a whole series (None where it is too short to judge)."""
    detector = SpikeDetector(window, k)
    for v in values:
        if v is not None:
            detector.update(float(v))
    return detector.score


def series(records: list[dict], key: str) -> list[float]:
    """The logged values of `key`, in order (missing and null ones left out)."""
    return [r[key] for r in records if key in r and r[key] is not None]


def spike_steps(records: list[dict], key: str, window: int = 5, k: float = 5.0) -> list[int]:
    """The steps at which series `key` spiked (the SpikeDetector, as scored)."""
    detector = SpikeDetector(window, k)
    return [r["step"] for r in records if r.get(key) is not None and detector.update(float(r[key]))]


# -- precursors ---------------------------------------------------------------------------------
# A loss spike is a step the SpikeDetector flags on train/loss. A signal crosses at step t when its
# value exceeds the median plus K robust standard deviations (1.4826 x the median absolute
# deviation) of its WINDOW values before t; a family (update norm, RMS_t, attention-logit max, log
# Z) crosses at the earliest crossing of any of its layers. A spike's lead for a family is s - t for
# the earliest crossing t in [s - LOOKBACK, s] (0: the same step as the loss; None: no crossing).
# Signals are read where they were logged, so a lead is only as fine as that cadence.
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
