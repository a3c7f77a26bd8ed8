"""Watchers over a run's scalar series: spike detection and the run-outcome classification."""

from __future__ import annotations

import math
from collections import deque

OUTCOMES = ("ok", "plateau", "collapsed", "unstable", "diverged", "interrupted")
# results: a rerun never trains them again
FINISHED = ("ok", "plateau", "collapsed", "unstable", "diverged")
# failures: they enter the failure curve, never a loss average
FAILED = ("collapsed", "unstable", "diverged")


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


def is_finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def dead_gradients_at(records: list[dict]) -> int | None:
    """The stats step from which the trunk's gradients (every parameter's but the output head's and
    the final norm's gain and bias) were exactly 0.0 (`grad/absmax/trunk` = 0) at every stats step
    to the run's last: the first of that final stretch, or None (never, or it revived). Nothing
    below the final norm can change then but by AdamW's leftover momentum and weight decay: an
    absorbing state (a final DyT with every unit saturated, |alpha x| >= 9.01, where float32 tanh's
    gradient is exactly 0; only the readout of its +-1 outputs still learns)."""
    at = None
    for r in records:
        value = r.get("grad/absmax/trunk")
        if value is not None:
            at = (at or r["step"]) if value == 0.0 else None
    return at


def classify(
    val_losses: list[float],
    unigram_entropy: float | None,
    margin: float,
    init_loss: float | None = None,
    blowup_margin: float = math.inf,
    steps: list[int] | None = None,
    flat_horizon: float = 1.0,
    dead_at: int | None = None,
) -> str:
    """The outcome of a finished run, judged on its own val curve (evals after step 0, in order, at
    `steps`):
    - 'diverged': the final val loss is missing or non-finite;
    - 'collapsed' / 'plateau': no eval got `margin` nats below the unigram entropy of the training
      data (it learned token frequencies and nothing more). The slope of its last evals (the last
      third, 3 at least; least squares) decides which: 'collapsed' (stuck, what post-norm does at a
      high LR) if at that slope it would not get `margin` below the entropy within `flat_horizon`
      times as many steps again as it has run while it sits at the unigram level (within `margin`
      above the entropy); otherwise 'plateau' (the LR too low or the run too short: still descending
      toward the unigram level, or leaving it). Not where the last value sits near a threshold. A
      run whose trunk gradients were dead (`dead_at`: dead_gradients_at) is 'collapsed' whatever its
      slope: only its head still learns, on features that no longer change, so it cannot leave that
      level;
    - 'unstable': it learned, then ended far above its best (final - best > blowup_margin) or above
      the loss at initialization (init_loss, the step-0 val loss);
    - 'ok': learned and kept it."""
    if not val_losses or val_losses[-1] is None or not math.isfinite(val_losses[-1]):
        return "diverged"
    steps = list(steps) if steps is not None else list(range(1, len(val_losses) + 1))
    finite = [v for v in val_losses if v is not None and math.isfinite(v)]
    final, best = val_losses[-1], min(finite)
    if unigram_entropy is not None and best > unigram_entropy - margin:
        tail = max(3, len(val_losses) // 3)
        points = [
            (s, v)
            for s, v in zip(steps[-tail:], val_losses[-tail:], strict=True)
            if v is not None and math.isfinite(v)
        ]
        if dead_at is not None:
            return "collapsed"  # stuck by construction, not by its slope
        if len(points) < 2:
            return "plateau"  # one eval: no slope to call it stuck
        # how far it would fall in as many steps again
        drop = -_slope(points) * flat_horizon * steps[-1]
        crosses = final - drop <= unigram_entropy - margin
        # far above it, it is still on its way down (too short)
        at_unigram = final <= unigram_entropy + margin
        return "collapsed" if at_unigram and not crosses else "plateau"
    if final - best > blowup_margin or (init_loss is not None and final > init_loss):
        return "unstable"
    return "ok"


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y on x."""
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
