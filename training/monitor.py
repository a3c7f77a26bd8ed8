"""Watchers over a run's scalar series: spike detection and the run-outcome classification."""

from __future__ import annotations

import math
from collections import deque

OUTCOMES = ("ok", "plateau", "unstable", "diverged", "interrupted")
FINISHED = ("ok", "plateau", "unstable", "diverged")  # results: a rerun never trains them again


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


def classify(val_losses: list[float], unigram_entropy: float | None, margin: float, init_loss: float | None = None,
             blowup_margin: float = math.inf) -> str:
    """The outcome of a finished run, judged on its whole val curve (evals after step 0, in order):
    - 'diverged': the final val loss is missing or non-finite;
    - 'plateau': no eval got `margin` nats below the unigram entropy of the training data (it learned token
      frequencies and nothing more);
    - 'unstable': it learned, then ended far above its best (final - best > blowup_margin) or above the loss at
      initialization (init_loss, the step-0 val loss);
    - 'ok': learned and kept it."""
    if not val_losses or val_losses[-1] is None or not math.isfinite(val_losses[-1]):
        return "diverged"
    finite = [v for v in val_losses if v is not None and math.isfinite(v)]
    final, best = val_losses[-1], min(finite)
    if unigram_entropy is not None and best > unigram_entropy - margin:
        return "plateau"
    if final - best > blowup_margin or (init_loss is not None and final > init_loss):
        return "unstable"
    return "ok"
