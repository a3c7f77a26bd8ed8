"""Numbers as every page of a study writes them (report.md, decision.md, the README's generated
blocks): one formatter for a value, one for a confidence interval, so the same number reads the same
everywhere."""

from __future__ import annotations

import math


def fmt(x, spec: str = ".3f") -> str:
    """x formatted by `spec`; '-' for a missing or non-finite value."""
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def g(x) -> str:
    """Three significant digits ('-' for none): LRs, LR50s and ratios."""
    return fmt(x, ".3g")


def interval(ci, spec: str = ".3g") -> str:
    """'lo..hi' of a 95% CI; an end the data leave unbounded (None) is 'open'; no CI at all is 'no
    CI'."""
    if not ci:
        return "no CI"
    return "..".join("open" if end is None else format(end, spec) for end in ci)


BUDGET = "train.steps"  # the budget axis: training tokens at a fixed model (docs/METHODS.md)
# in an arm's label (the LR schedule follows the steps)
BUDGET_PARTS = ("steps=", "schedule_steps=")


def bare(label: str) -> str:
    """An arm's label without its budget parts: 'rmsnorm/pre' for 'rmsnorm/pre/steps=300'."""
    return "/".join(p for p in label.split("/") if not p.startswith(BUDGET_PARTS))


def steps_of(label: str) -> int | None:
    """The budget in an arm's label ('.../steps=300' -> 300); None where the arms share one."""
    return next((int(p[6:]) for p in label.split("/") if p.startswith("steps=")), None)


def lr50_cell(fit) -> str:
    """An arm's LR50 as a table states it: the number and CI where identified, else the bound."""
    if fit.identified:
        return f"{fmt(fit.lr50, '.3g')} ({interval(fit.ci)})"
    return fit.bracket() + f" ({fit.failed}/{fit.n} in all)"


def rank_shift(r: dict) -> str:
    """'-0.013 nats (95% CI -0.030..+0.004, Hodges-Lehmann)': a number failed runs decide is '?'."""
    ci = r.get("ci") or [None, None]
    lo, hi, x = (f"{v:+.3f}" if v is not None else "?" for v in (*ci, r.get("shift")))
    return f"{x} nats (95% CI {lo}..{hi}, Hodges-Lehmann)"
