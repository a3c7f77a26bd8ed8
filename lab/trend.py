"""How a comparison moves along a numeric axis of the arms (width, depth, ...): for each group of
arm pairs that differ in one field (the norm, say) and agree on everything else but the axis, the
LR50 ratio and the nested loss difference at each value of the axis, and a fitted slope with its 95%
CI. And how one arm's LR sensitivity moves along it (Wortsman et al. 2023, Fig. 1 right, Fig. 7-8):
for each group of arms that agree on everything but the axis, the mean over seeds of its LR
sensitivity (lab/sensitivity.py) with its t interval (df n - 1) at each value.

The slope is a random-effects meta-regression (DerSimonian-Laird): each point's estimate (log10 of
the LR50 ratio, or the loss difference in nats) with the standard error read off its own 95% CI by
the quantile that made it (half-width / t_{n-1} for a paired loss difference of n seeds, / z for a
profile-likelihood LR50 ratio), against log2 of the axis (per doubling; an axis is a scale, every
value positive: numeric_axes). The points' scatter about the weighted line beyond their own CIs is a
between-point variance tau^2 (method of moments: Q_E - (k - 2) over its expectation's slope, at
least 0), and each point is weighted by 1 / (se^2 + tau^2): where the points agree with a line
(tau^2 = 0) this is the fixed-effect fit, where they do not, one precise point can no longer carry
the slope. The slope's CI is Knapp-Hartung's: its variance 1 / sum w (x - x_w)^2 scaled by the
weighted residual mean square (at least 1) and a t quantile with k - 2 degrees of freedom, so a
slope from 3 points is as uncertain as 3 points are; 2 points give a slope without a CI. Points
without a two-sided CI (an open end, one seed, an LR50 that is only bounded) are left out and
counted. Nothing is said beyond the largest value measured."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import norm as normal
from scipy.stats import t as student

Z = float(normal.ppf(0.975))


def quantile(df: int | None) -> float:
    """The 97.5% quantile a 95% CI was made with: t with df degrees of freedom, or z (df None)."""
    return Z if df is None else float(student.ppf(0.975, df))


@dataclass
class Trend:
    what: str  # "LR50 ratio" | "loss difference" | "LR sensitivity"
    pair: str  # "layernorm - rmsnorm at placement=post"
    axis: str
    log2: bool
    points: list[tuple[float, float | None, tuple | None]]  # (axis value, estimate, CI) as reported
    slope: float | None
    ci: tuple[float, float] | None
    used: int  # points with a two-sided CI, the ones the slope is fitted to
    dfs: tuple = ()  # each point's CI's degrees of freedom (None: a z interval); () = all z
    arms: tuple = ()  # LR sensitivity: the arm labels behind the points, in axis order

    def describe(self) -> str:
        unit = "log10 ratio" if self.what == "LR50 ratio" else "nats"
        of = "of " if self.what == "LR sensitivity" else ""
        per = "per doubling of " + self.axis if self.log2 else "per unit of " + self.axis
        pts = "; ".join(
            f"{x:g}: "
            + ("-" if e is None else f"{e:+.3f}")
            + (f" ({ci[0]:+.3f}..{ci[1]:+.3f})" if ci else "")
            for x, e, ci in self.points
        )
        head = f"{self.what} {of}{self.pair}, in {unit}, by {self.axis}: {pts}"
        if any(e is None for _, e, _ in self.points):
            head += " ('-': no estimate: " + {
                "LR50 ratio": "an arm's LR50 is only bounded)",
                "LR sensitivity": "no seed ran every LR of the grid)",
            }.get(self.what, "no seed where both arms trained)")
        if self.slope is None:
            return (
                f"{head}; no slope ({self.used} of {len(self.points)} points have a two-sided CI)"
            )
        ci = (
            f"Knapp-Hartung 95% CI {self.ci[0]:+.3f}..{self.ci[1]:+.3f}"
            if self.ci
            else "no CI from 2 points"
        )
        return (
            f"{head}; slope {self.slope:+.3f} {per} ({ci}, from {self.used} of {len(self.points)} "
            "points; "
            f"{self.axis} {min(p[0] for p in self.points):g}..{max(p[0] for p in self.points):g} "
            "only)"
        )


def _weighted(
    points: list[tuple[float, float | None, tuple | None]], log2: bool, tau2: float = 0.0, dfs=()
):
    """The points with a two-sided CI as (x, estimate, se), x on the fit's scale, their weights 1 /
    (se^2 + tau2), and the weighted centre (x_w, y_w) the fitted line passes through (None when no
    point has a CI)."""
    dfs = list(dfs) or [None] * len(points)
    usable = [
        (math.log2(x) if log2 else x, e, (ci[1] - ci[0]) / (2 * quantile(df)))
        for (x, e, ci), df in zip(points, dfs, strict=True)
        if e is not None
        and ci is not None
        and ci[0] is not None
        and ci[1] is not None
        and ci[1] > ci[0]
    ]
    w = [1 / (se**2 + tau2) for _, _, se in usable]
    if not usable:
        return usable, w, None
    return (
        usable,
        w,
        (
            sum(wi * x for wi, (x, _, _) in zip(w, usable, strict=True)) / sum(w),
            sum(wi * y for wi, (_, y, _) in zip(w, usable, strict=True)) / sum(w),
        ),
    )


def _line(usable, w, centre) -> tuple[float, float]:
    """(slope, its variance) of the weighted least-squares line through `centre`."""
    xw, yw = centre
    sxx = sum(wi * (x - xw) ** 2 for wi, (x, _, _) in zip(w, usable, strict=True))
    return sum(
        wi * (x - xw) * (y - yw) for wi, (x, y, _) in zip(w, usable, strict=True)
    ) / sxx, 1 / sxx


def tau2(points: list[tuple[float, float | None, tuple | None]], log2: bool, dfs=()) -> float:
    """Between-point variance about the line (DerSimonian-Laird for a meta-regression on one
    covariate): max(0, (Q_E - (k - 2)) / (sum w - tr((X'WX)^-1 X'W^2X))), Q_E the fixed-effect fit's
    weighted residual sum of squares; 0 with fewer than 3 points (no residual degree of freedom)."""
    usable, w, centre = _weighted(points, log2, 0.0, dfs)
    k = len(usable)
    if k < 3 or len({x for x, _, _ in usable}) < 2:
        return 0.0
    slope, _ = _line(usable, w, centre)
    xw, yw = centre
    q = sum(wi * (y - yw - slope * (x - xw)) ** 2 for wi, (x, y, _) in zip(w, usable, strict=True))
    s0, s1, s2 = (
        sum(w),
        sum(wi * x for wi, (x, _, _) in zip(w, usable, strict=True)),
        sum(wi * x * x for wi, (x, _, _) in zip(w, usable, strict=True)),
    )
    t0, t1, t2 = (
        sum(wi**2 * x**j for wi, (x, _, _) in zip(w, usable, strict=True)) for j in (0, 1, 2)
    )
    det = s0 * s2 - s1 * s1
    trace = (s2 * t0 - 2 * s1 * t1 + s0 * t2) / det  # tr((X'WX)^-1 X'W^2X) for X = [1, x]
    return max(0.0, (q - (k - 2)) / (s0 - trace))


def fitted(t: Trend, x: float) -> float:
    """The fitted line's value at axis value x (it passes through the weighted centre of the
    points)."""
    _, _, (xw, yw) = _weighted(t.points, t.log2, tau2(t.points, t.log2, t.dfs), t.dfs)
    return yw + t.slope * ((math.log2(x) if t.log2 else x) - xw)


def fit(
    points: list[tuple[float, float | None, tuple | None]], log2: bool, dfs=()
) -> tuple[float | None, tuple | None, int]:
    """(slope, its Knapp-Hartung 95% CI (None from 2 points), points used) of the estimates against
    the axis."""
    usable, w, centre = _weighted(points, log2, tau2(points, log2, dfs), dfs)
    k = len(usable)
    if len({x for x, _, _ in usable}) < 2:
        return None, None, k
    slope, var = _line(usable, w, centre)
    if k < 3:
        return slope, None, k
    xw, yw = centre
    q = sum(
        wi * (y - yw - slope * (x - xw)) ** 2 for wi, (x, y, _) in zip(w, usable, strict=True)
    ) / (k - 2)
    half = float(student.ppf(0.975, k - 2)) * math.sqrt(max(1.0, q) * var)
    return slope, (slope - half, slope + half), k


def numeric_axes(res) -> list[str]:
    """The arm fields that are a scale: every value a positive number (not a boolean), at least two
    values. A field with a 0 among its values (z-loss 0 / 1e-4, warm-up 0 / 100 steps, weight decay
    0 / 1e-4 / 3e-2) switches something on or off: its comparisons are the arms' own, a slope per
    unit of it would mean nothing."""
    out = []
    for key in res.keys:
        values = {a.runs[0].config.get(key) for a in res.arms.values()}
        if len(values) > 1 and all(
            isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values
        ):
            out.append(key)
    return out


def sensitivity_trends(res, axis: str) -> list[Trend]:
    """Each group of arms that agree on every field but `axis` (at least two values of it): the
    arm's LR sensitivity at each value, mean over seeds with its t interval, and the fitted
    slope."""
    from lab.paired import mean_ci

    groups: dict = {}
    for label, a in res.arms.items():
        rest = tuple((k, a.runs[0].config.get(k)) for k in res.keys if k != axis)
        groups.setdefault(rest, []).append(label)
    out = []
    for rest, labels in groups.items():
        if len(labels) < 2:
            continue
        labels.sort(key=lambda label: res.arms[label].runs[0].config.get(axis))
        xs = [res.arms[label].runs[0].config.get(axis) for label in labels]
        pts, dfs = [], []
        for x, label in zip(xs, labels, strict=True):
            sens = res.sensitivity.get(label)
            values = list(sens.per_seed.values()) if sens is not None else []
            mean, ci = mean_ci(values)
            pts.append((x, mean, ci))
            dfs.append(max(len(values) - 1, 1))
        if all(e is None for _, e, _ in pts):
            continue
        where = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in rest) or "every arm"
        out.append(
            Trend(
                "LR sensitivity",
                where,
                axis,
                True,
                pts,
                *fit(pts, True, dfs),
                tuple(dfs),
                tuple(labels),
            )
        )
    return out


def trends(res) -> list[Trend]:
    """Every trend of res.comparisons, and of the arms' LR sensitivity, along every numeric axis
    (lab/result.py StudyResult)."""
    out = []
    for axis in numeric_axes(res):
        out += sensitivity_trends(res, axis)
        groups: dict = {}
        for c in res.comparisons:
            if c.key == axis:
                continue
            rest = tuple((k, c.a.runs[0].config.get(k)) for k in res.keys if k not in (axis, c.key))
            # the values compared
            pair = (c.a.runs[0].config.get(c.key), c.b.runs[0].config.get(c.key))
            groups.setdefault((c.key, pair, rest), []).append(c)
        for (key, _, rest), comps in groups.items():
            if len(comps) < 2:
                continue
            comps.sort(key=lambda c: c.a.runs[0].config.get(axis))
            xs = [c.a.runs[0].config.get(axis) for c in comps]
            log2 = True  # numeric_axes: every value positive
            a, b = (comps[0].a.runs[0].config.get(key), comps[0].b.runs[0].config.get(key))
            where = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in rest)
            at = f" at {where}" if where else ""
            ratio_pts = [
                (
                    x,
                    None if not c.ratio.identified else math.log10(c.ratio.ratio),
                    None
                    if not c.ratio.identified or not c.ratio.ci or None in c.ratio.ci
                    else tuple(math.log10(v) for v in c.ratio.ci),
                )
                for x, c in zip(xs, comps, strict=True)
            ]
            loss_pts = [
                (x, c.loss.paired.mean, c.loss.paired.ci) for x, c in zip(xs, comps, strict=True)
            ]
            loss_dfs = tuple(max(c.loss.paired.n - 1, 1) for c in comps)
            for what, op, pts, dfs in (
                ("LR50 ratio", "/", ratio_pts, ()),
                ("loss difference", "-", loss_pts, loss_dfs),
            ):
                # an LR50 without failures
                if what == "LR50 ratio" or any(e is not None for _, e, _ in pts):
                    out.append(
                        Trend(what, f"{a} {op} {b}{at}", axis, log2, pts, *fit(pts, log2, dfs), dfs)
                    )
    return out
