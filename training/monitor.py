"""Watchers over a run's scalar series: spike detection and the run-outcome classification."""

from __future__ import annotations

import math
from collections import deque

OUTCOMES = ("ok", "plateau", "diverged", "interrupted")


class SpikeDetector:
    """A value is a spike when it is >= k standard deviations from the mean of the trailing `window`
    values (OLMo 2 uses k=7 over 1000 steps; short runs use a shorter window). Values are judged only
    once the window is full; spikes stay in the window, as in a rolling mean of the previous values."""

    def __init__(self, window: int = 100, k: float = 5.0):
        self.window, self.k = window, k
        self.values: deque[float] = deque(maxlen=window)
        self.seen = self.spikes = 0

    def update(self, value: float) -> bool:
        """Record `value`; True if it is a spike."""
        spike = False
        if math.isfinite(value):
            if len(self.values) == self.window:
                mean = sum(self.values) / self.window
                std = math.sqrt(sum((v - mean) ** 2 for v in self.values) / self.window)
                spike = abs(value - mean) >= self.k * std and std > 0
                self.seen += 1
                self.spikes += spike
            self.values.append(value)
        return spike

    @property
    def score(self) -> float | None:
        """Percentage of judged steps that were spikes (None before the window first fills)."""
        return 100.0 * self.spikes / self.seen if self.seen else None


def spike_score(values, window: int = 100, k: float = 5.0) -> float | None:
    """The spike score of a whole series (None where it is shorter than the window)."""
    detector = SpikeDetector(window, k)
    for v in values:
        if v is not None:
            detector.update(float(v))
    return detector.score


def is_finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def classify(final_val_loss: float | None, unigram_entropy: float | None, margin: float) -> str:
    """'plateau' when a finished run's val loss never got `margin` nats below the unigram entropy of its
    training data (it learned token frequencies and nothing more), else 'ok'."""
    if final_val_loss is None or not math.isfinite(final_val_loss):
        return "diverged"
    if unigram_entropy is not None and final_val_loss > unigram_entropy - margin:
        return "plateau"
    return "ok"
