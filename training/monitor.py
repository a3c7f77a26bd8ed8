"""The run-outcome classification over a run's scalar series (spike detection is the library's:
normlab/spikes.py)."""

from __future__ import annotations

import math

OUTCOMES = ("ok", "plateau", "collapsed", "unstable", "diverged", "interrupted")
# results: a rerun never trains them again
FINISHED = ("ok", "plateau", "collapsed", "unstable", "diverged")
# failures: they enter the failure curve, never a loss average
FAILED = ("collapsed", "unstable", "diverged")


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
