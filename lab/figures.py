"""The report's figures, drawn from arms (matplotlib, Agg backend): loss and grad-norm curves per
arm, the stability map, per-layer gradient heatmaps, activation RMS by depth, attention-logit
growth."""

from __future__ import annotations

import math
import statistics
import zlib
from collections import Counter
from pathlib import Path

from lab.arms import max_series, mean_of
from lab.read import Run
from lab.sensitivity import capped
from lab.text import fmt
from lab.trend import fitted
from training.rundir import replacing

# One colour per norm and one line style per placement, the same in every panel and figure; a
# name not listed takes a fixed one from the fallback cycle (by a hash of the name, so it too is the
# same in every figure and study).
NORM_COLORS = {
    "rmsnorm": "#1f77b4",
    "layernorm": "#ff7f0e",
    "dyt": "#2ca02c",
    "prmsnorm": "#d62728",
    "none": "#7f7f7f",
}
OTHER_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
PLACEMENT_STYLES = {
    "pre": "-",
    "post": "--",
    "peri": "-.",
    "reordered": ":",
    "deepnorm": (0, (6, 2, 1, 2, 1, 2)),
}
OTHER_STYLES = ((0, (1, 1)), (0, (4, 1, 1, 1)), (0, (8, 2)), (0, (2, 2, 6, 2)))
# Arms that share a norm and a placement (they differ in eps, width, ...) are told apart by marker.
VARIANT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _fixed(name, table: dict, others: tuple):
    return table.get(name) or others[zlib.crc32(str(name).encode()) % len(others)]


def norm_color(norm) -> str:
    """The colour of a norm name: NORM_COLORS, else a fixed one of OTHER_COLORS."""
    return _fixed(norm, NORM_COLORS, OTHER_COLORS)


def placement_style(placement):
    """The line style of a placement: PLACEMENT_STYLES, else a fixed one of OTHER_STYLES."""
    return _fixed(placement, PLACEMENT_STYLES, OTHER_STYLES)


def arm_styles(arms: dict) -> dict:
    """{label: {color, ls, marker, variant}}: colour by the arm's norm, line style by its placement,
    marker by its rank among the arms that share both (variant: whether there is more than one)."""
    from training.config import Config, flat, to_dict

    default = flat(to_dict(Config()))
    keys = {}
    for label, a in arms.items():
        cfg = {**default, **(a.runs[0].config if a.runs else {})}
        keys[label] = (cfg.get("model.norm"), cfg.get("model.placement"))
    out = {}
    for label, key in keys.items():
        same = [x for x, k in keys.items() if k == key]
        out[label] = dict(
            color=norm_color(key[0]),
            ls=placement_style(key[1]),
            marker=VARIANT_MARKERS[same.index(label) % len(VARIANT_MARKERS)],
            variant=len(same) > 1,
        )
    return out


def _line(st: dict, n: int = 0) -> dict:
    """A line's style: colour and line style, and the marker where it is a variant (every n-th
    point of an n-spaced series, n = 0 every point)."""
    kw = dict(color=st["color"], ls=st["ls"])
    if st["variant"]:
        kw.update(marker=st["marker"], ms=4, markevery=max(n, 1))
    return kw


def _smooth(ys: list[float], n: int) -> list[float]:
    out, acc = [], None
    alpha = 2 / (n + 1)
    for y in ys:
        acc = y if acc is None else alpha * y + (1 - alpha) * acc
        out.append(acc)
    return out


def _axes(
    ax,
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
    logy: bool = False,
    legend: int = 7,
):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if ax.get_legend_handles_labels()[0]:  # an empty panel (nothing measured) gets no legend
        ax.legend(fontsize=legend)


def _save(fig, path: Path, made: list, caption: str) -> None:
    import matplotlib.pyplot as plt

    with replacing(path) as tmp:  # the old figure or the new one, never half of one
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    made.append((path.name, caption))


def figures(res, out: Path) -> list[tuple[str, str]]:
    """Every figure of a StudyResult's report, drawn into `out`; [(file name, caption)] of those
    made."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = res.arms
    colors = arm_styles(arms)
    made: list[tuple[str, str]] = []
    for draw in (loss_curves, grad_norm_curves, grad_heatmaps, act_rms_depth, attn_logit_max):
        draw(plt, arms, colors, out, made)
    stability_map(plt, res, colors, out, made)
    log_z_curves(plt, res, colors, out, made)
    dyt_saturation(plt, res, colors, out, made)
    final_losses(plt, res, colors, out, made)
    loss_vs_lr(plt, res, colors, out, made)
    trend_figure(plt, res, out, made)
    sensitivity_by_axis(plt, res, out, made)
    multiples_figure(plt, res, out, made)
    first = "multiples.png" if res.file.multiples else "stability_map.png"
    return sorted(made, key=lambda m: m[0] != first)


def result_figures(res, out: Path) -> list[tuple[str, str]]:
    """The figures drawn from the result and the val curves alone (what an archived study can
    redraw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = arm_styles(res.arms)
    made: list[tuple[str, str]] = []
    for draw in (stability_map, final_losses, loss_vs_lr):
        draw(plt, res, colors, out, made)
    trend_figure(plt, res, out, made)
    sensitivity_by_axis(plt, res, out, made)
    multiples_figure(plt, res, out, made)
    return made


def multiples_figure(plt, res, out: Path, made: list) -> None:
    """A multiples study (lab/multiples.py): per test pair a panel of every seed's final loss
    against the multiple of its arm's best LR, both arms side by side and the yardstick's pair in
    grey; an unstable run drawn as an x at the top, the arms' medians joined."""
    from lab.multiples import _of, factor

    spec = res.file.multiples
    tests = [p for p in spec.compare if p.role == "test"] if spec else []
    if not tests:
        return
    pairs = {p.name: p for p in spec.compare}
    fig, axes = plt.subplots(1, len(tests), figsize=(5.5 * len(tests), 4.2), squeeze=False)
    top = max(r.final for r in res.runs if r.final is not None and math.isfinite(r.final))
    for ax, test in zip(axes[0], tests, strict=True):
        sides = [(test.a, "#1f77b4", -0.06), (test.b, "#d62728", 0.06)]
        yard = pairs.get(test.yardstick)
        if yard is not None:
            sides += [(yard.a, "#7f7f7f", -0.02), (yard.b, "#bdbdbd", 0.02)]
        differ = [k for k, _ in sides[0][0] if len({dict(a)[k] for a, _, _ in sides}) > 1]
        for arm, color, shift in sides:
            runs = [r for r in _of(res.runs, arm) if r.finished]
            label = ", ".join(f"{k.split('.')[-1]}={dict(arm)[k]}" for k in differ)
            medians = []
            for f in spec.factors:
                at = [r for r in runs if factor(r, spec) == f]
                ok = [r.final for r in at if r.why is None]
                bad = [r for r in at if r.why is not None]
                x = f * 10**shift
                ax.plot([x] * len(ok), ok, "o", color=color, ms=3, alpha=0.5)
                ax.plot([x] * len(bad), [top + 0.05] * len(bad), "x", color=color, ms=5)
                medians.append(sorted(ok)[len(ok) // 2] if ok else None)
            xs = [f * 10**shift for f, m in zip(spec.factors, medians, strict=True) if m]
            ax.plot(xs, [m for m in medians if m], "-", color=color, lw=1.2, label=label)
        _axes(ax, "x its arm's best LR", "final val loss (x: unstable)", test.name, logx=True)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{res.file.name}: every seed at each multiple of its arm's best LR")
    _save(
        fig, out / "multiples.png", made, "Final loss of every seed at each multiple of the best LR"
    )


MAX_PANELS = 8


def _curves(
    plt, arms, colors, out: Path, made: list, key: str, fname: str, title: str, logy: bool
) -> None:
    """One panel per learning rate, one thin line per seed and arm; at most MAX_PANELS panels: the
    LRs with the most runs (a bisection's one-run LRs would make a figure 280,000 pixels wide)."""
    runs_at = Counter(r.lr for a in arms.values() for r in a.runs)
    lrs = sorted({lr for a in arms.values() for lr in a.lrs})
    shown = sorted(sorted(lrs, key=lambda lr: (-runs_at[lr], lr))[:MAX_PANELS])
    which = f" (the {len(shown)} of {len(lrs)} LRs with most runs)" if len(shown) < len(lrs) else ""
    lrs = shown
    l0 = mean_of([a.l0 for a in arms.values()])
    steps_total = max((len(r.records) for a in arms.values() for r in a.runs), default=1)
    fig, axes = plt.subplots(1, len(lrs), figsize=(3.2 * len(lrs), 3.2), sharey=True, squeeze=False)
    lowest = math.inf
    for ax, lr in zip(axes[0], lrs, strict=True):
        for label, a in arms.items():
            for i, r in enumerate(a.at(lr)):  # one thin line per seed: split outcomes stay visible
                pts = [
                    (rec["step"], rec[key])
                    for rec in r.records
                    if rec.get(key) is not None and rec["step"] > 0
                ]
                if pts:
                    ys = _smooth([v for _, v in pts], max(1, steps_total // 50))
                    lowest = min(lowest, min(ys))
                    ax.plot(
                        [s for s, _ in pts],
                        ys,
                        **_line(colors[label], max(1, len(pts) // 8)),
                        lw=0.9,
                        alpha=0.8,
                        label=label if i == 0 else None,
                    )
        ax.set_title(f"lr {lr:g}")
        ax.set_xlabel("step")
        if logy:
            ax.set_yscale("log")
    if not logy and l0 and math.isfinite(lowest):
        # shared: diverging spikes are cut
        axes[0][0].set_ylim(lowest - 0.05 * (l0 - lowest), l0 * 1.05)
    axes[0][0].set_ylabel(f"{title}\n(one line per seed, smoothed)")
    axes[0][-1].legend(fontsize=7)
    _save(fig, out / fname, made, f"{title} per arm and learning rate{which}")


def loss_curves(plt, arms, colors, out: Path, made: list) -> None:
    _curves(plt, arms, colors, out, made, "train/loss", "loss_curves.png", "train loss", logy=False)


def grad_norm_curves(plt, arms, colors, out: Path, made: list) -> None:
    _curves(
        plt,
        arms,
        colors,
        out,
        made,
        "grad/norm",
        "grad_norm_curves.png",
        "grad norm (before clipping)",
        logy=True,
    )


def stability_map(plt, res, colors, out: Path, made: list) -> None:
    """P(fail | lr) per arm: every run a marker at 0 (trained) or 1 (failed), jittered apart, and
    the arm's fitted failure curve with LR50 and its 95% CI; no mean line through values no run
    reached."""
    import numpy as np

    arms = res.arms
    fig, ax = plt.subplots(figsize=(6.4, 4))
    lrs = [r.lr for a in arms.values() for r in a.runs]
    grid = np.geomspace(min(lrs) / 1.5, max(lrs) * 1.5, 200)
    for i, (label, a) in enumerate(arms.items()):
        fit = res.failures[label]
        shift = 0.04 * (i - (len(arms) - 1) / 2)
        for r in a.upper():
            marker = {"diverged": "x", "plateau": "o", "collapsed": "s", "unstable": "^"}.get(
                r.status, "."
            )
            y = (1.0 if r.failed else 0.0) + shift
            style = (
                dict(facecolors="none", edgecolors=colors[label]["color"])
                if marker in "os^"
                else dict(color=colors[label]["color"])
            )
            ax.scatter(
                [r.lr * 10 ** (shift / 2)], [y], marker=marker, s=30, zorder=5, alpha=0.8, **style
            )
        if fit.identified:
            p = 1 / (1 + np.exp(-fit.slope * (np.log10(grid) - np.log10(fit.lr50))))
            ax.plot(
                grid,
                p,
                **_line(colors[label], 40),
                lw=1.4,
                label=f"{label}: {fit.describe().split(' (')[0]}",
            )
            lo, hi = fit.ci
            ax.plot(
                [lo or grid[0], hi or grid[-1]],
                [0.5 + shift] * 2,
                color=colors[label]["color"],
                lw=4,
                alpha=0.35,
                solid_capstyle="butt",
            )
        else:  # only a bound: no curve drawn, the bound's range shaded at 1/2
            lo, hi = fit.bounds if fit.failed else (fit.top, None)
            ax.plot(
                [lo or grid[0], hi or grid[-1]],
                [0.5 + shift] * 2,
                color=colors[label]["color"],
                lw=4,
                alpha=0.2,
                ls=":",
                label=f"{label}: {fit.describe().split(':')[0]}",
            )
    ax.axhline(0.5, color="gray", ls=":", lw=0.8)
    _axes(
        ax,
        "peak learning rate",
        "P(run fails)",
        "failure curves: every run at 0 (trained) or 1 (failed)",
        logx=True,
    )
    _save(
        fig,
        out / "stability_map.png",
        made,
        "Stability map: each arm's fitted P(fail | lr) with LR50 and its 95% CI (thick bar) where "
        "the data identify it, else the bound (faint dotted bar); colour: the norm, line style: "
        "the placement; every run from the arm's floor up at 0 (trained) or 1 (failed under the "
        "study's rule), marked by train.py's label (. ok, o plateau, s collapsed, ^ unstable, x "
        "diverged)",
    )


def loss_vs_lr(plt, res, colors, out: Path, made: list) -> None:
    """Wortsman et al. 2023 Fig. 1 style: final val loss vs LR, every run of every seed (a failed
    one where it ended, capped at L0, hollow), one panel per group of arms that differ only in the
    norm (e.g. per placement), with each arm's LR sensitivity in the legend."""
    groups: dict = {}
    for label, a in res.arms.items():
        rest = tuple((k, a.runs[0].config.get(k)) for k in res.keys if k != "model.norm")
        groups.setdefault(rest, []).append((label, a))
    fig, axes = plt.subplots(
        1, len(groups), figsize=(4.6 * len(groups), 3.8), sharey=True, squeeze=False
    )
    for ax, (rest, members) in zip(axes[0], groups.items(), strict=True):
        for label, a in members:
            pts = [
                (r.lr, capped(r, r.init_loss), r.failed)
                for r in a.runs
                if r.finished and r.init_loss is not None
            ]
            sens = res.sensitivity.get(label)
            tag = f" (S = {sens.mean:.2f})" if sens is not None and sens.mean is not None else ""
            ok = [(x, y) for x, y, f in pts if not f]
            bad = [(x, y) for x, y, f in pts if f]
            st = colors[label]
            if ok:
                ax.scatter(
                    *zip(*ok, strict=True),
                    color=st["color"],
                    marker=st["marker"],
                    s=14,
                    label=label + tag,
                )
            if bad:
                ax.scatter(
                    *zip(*bad, strict=True),
                    facecolors="none",
                    edgecolors=st["color"],
                    marker=st["marker"],
                    s=18,
                    label=None if ok else label + tag,
                )
            means = {}
            for x, y, _ in pts:
                means.setdefault(x, []).append(y)
            xs = sorted(means)
            ax.plot(
                xs,
                [statistics.fmean(means[x]) for x in xs],
                color=st["color"],
                ls=st["ls"],
                lw=0.8,
                alpha=0.6,
            )
        where = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in rest) or "all arms"
        _axes(
            ax,
            "peak learning rate",
            "final val loss (failed: hollow, capped at L0)" if ax is axes[0][0] else "",
            where,
            logx=True,
        )
    _save(
        fig,
        out / "loss_vs_lr.png",
        made,
        "Final val loss vs learning rate, every run (Wortsman et al. 2023, Fig. 1 style): filled "
        "trained, hollow "
        "failed under the study's rule, drawn where it ended (capped at L0); S is the arm's LR "
        "sensitivity over "
        "the study's grid",
    )


def final_losses(plt, res, colors, out: Path, made: list) -> None:
    """Final val loss vs LR of every run that trained, seed by seed; each arm's best LR (selection
    seeds) ringed."""
    if not any(r.loss is not None for a in res.arms.values() for r in a.runs):
        return  # no run trained: nothing to draw
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, a in res.arms.items():
        pts = [(r.lr, r.loss) for r in a.runs if r.loss is not None]
        st = colors[label]
        if pts:
            ax.scatter(
                *zip(*pts, strict=True), color=st["color"], marker=st["marker"], s=18, label=label
            )
        if a.best_lr is not None:
            best = list(a.losses(a.best_lr).values())
            ax.scatter(
                [a.best_lr] * len(best),
                best,
                s=90,
                facecolors="none",
                edgecolors=st["color"],
                linestyles=st["ls"],
            )
    entropy = mean_of([r.summary.get("unigram_entropy") for a in res.arms.values() for r in a.runs])
    if entropy:
        ax.axhline(entropy, color="gray", ls="--", lw=1, label="unigram entropy")
    _axes(
        ax,
        "peak learning rate",
        "final val loss (runs that trained)",
        "loss of every run that trained",
        logx=True,
    )
    _save(
        fig,
        out / "final_loss.png",
        made,
        "Final val loss of every run that trained vs learning rate (failed runs are in the "
        "stability map, not "
        "here); rings: each arm's best LR, chosen on the selection seeds",
    )


def grad_heatmaps(plt, arms, colors, out: Path, made: list) -> None:
    """Per-layer gradient norm (layer x step) at each arm's best LR, first seed, on one color
    scale."""
    grids = {}
    for label, a in arms.items():
        run = next((r for r in a.at(a.best_lr)), None) if a.best_lr else None
        grid = _layer_matrix(run, "grad/norm/layer_") if run else None
        if grid:
            grids[label] = (grid[0], [[math.log10(max(v, 1e-12)) for v in row] for row in grid[1]])
    values = [v for _, mat in grids.values() for row in mat for v in row]
    fig, axes = plt.subplots(
        1, len(arms), figsize=(3.4 * len(arms) + 1, 3), sharey=True, squeeze=False
    )
    im = None
    for ax, (label, a) in zip(axes[0], arms.items(), strict=True):
        if label in grids:
            steps, mat = grids[label]
            im = ax.imshow(
                mat,
                aspect="auto",
                origin="lower",
                cmap="viridis",
                vmin=min(values),
                vmax=max(values),
                extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, len(mat) - 0.5),
            )  # one step: 1 wide
            ax.set_yticks(range(len(mat)))
        ax.set_title(
            f"{label} (lr {fmt(a.best_lr, 'g')})", fontsize=9, color=colors[label]["color"]
        )
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("layer")
    if im is not None:  # one color scale for all arms, so they compare
        fig.colorbar(im, ax=list(axes[0]), label="log10 grad norm")
    _save(
        fig,
        out / "grad_heatmaps.png",
        made,
        "per-layer gradient norm (layer x step) at each arm's best LR, first seed",
    )


def act_rms_depth(plt, arms, colors, out: Path, made: list) -> None:
    """RMS of the residual stream after each block, at step 1 and at the end (median over seeds,
    best LR)."""
    drawn = {
        label: [m for m in (_layer_matrix(r, "act/rms/layer_") for r in a.at(a.best_lr)) if m]
        for label, a in arms.items()
        if a.best_lr
    }
    if not any(drawn.values()):
        return  # no arm trained at any LR: nothing to draw
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, mats in drawn.items():
        if mats:
            last = [statistics.median(m[1][i][-1] for m in mats) for i in range(len(mats[0][1]))]
            first = [statistics.median(m[1][i][0] for m in mats) for i in range(len(mats[0][1]))]
            st = colors[label]
            ax.plot(
                range(len(last)),
                last,
                marker=st["marker"],
                color=st["color"],
                ls=st["ls"],
                label=f"{label} (end)",
            )
            ax.plot(
                range(len(first)),
                first,
                marker=st["marker"],
                mfc="none",
                color=st["color"],
                ls=st["ls"],
                lw=0.8,
                alpha=0.5,
                label=f"{label} (step 1)",
            )
    layers = max(
        (int(r.config.get("model.n_layers", 1)) for a in arms.values() for r in a.runs), default=1
    )
    ax.set_xticks(range(layers))
    _axes(
        ax,
        "layer",
        "RMS of the residual stream after the block",
        "activation RMS by depth at each arm's best LR",
        logy=True,
        legend=6,
    )
    _save(
        fig,
        out / "act_rms_depth.png",
        made,
        "activation RMS by depth (step 1 faint and hollow, the last logged step solid); colour: "
        "the norm, line style: the placement",
    )


def attn_logit_max(plt, arms, colors, out: Path, made: list) -> None:
    """The largest attention logit a run saw, vs learning rate (Wortsman et al. 2023's logit
    growth)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, a in arms.items():
        xs, ys = [], []
        for lr in a.lrs:
            v = mean_of([max_series(r, "attn/logit_max/") for r in a.at(lr)])
            if v is not None:
                xs.append(lr)
                ys.append(v)
        st = colors[label]
        ax.plot(xs, ys, marker=st["marker"], color=st["color"], ls=st["ls"], label=label)
    _axes(
        ax,
        "peak learning rate",
        "max attention logit over steps and layers",
        "attention-logit growth (Wortsman et al. 2023)",
        logx=True,
        logy=True,
    )
    _save(fig, out / "attn_logit_max.png", made, "max attention logit vs learning rate")


def dyt_saturation(plt, res, colors, out: Path, made: list) -> None:
    """DyT's absorbing state: per DyT arm, the saturated fraction of its final norm (|alpha x| >= 9,
    where float32 tanh's gradient is exactly 0) and the largest gradient below it, vs step, for one
    run that trained (the arm's best LR) and one that failed (its lowest LR where a run failed),
    seed by seed of the lowest seed; drawn when a run logged dyt/saturated/final."""

    def pick(a, failed: bool):
        lrs = [lr for lr in a.lrs if any(r.failed == failed and r.finished for r in a.at(lr))]
        if not lrs:
            return None
        lr = a.best_lr if not failed and a.best_lr in lrs else min(lrs)
        rs = sorted(
            (r for r in a.at(lr) if r.failed == failed and r.finished), key=lambda r: str(r.seed)
        )
        return rs[0] if rs else None

    shown = [
        (label, r)
        for label, a in res.arms.items()
        for r in (pick(a, False), pick(a, True))
        if r is not None and any("dyt/saturated/final" in e for e in r.records)
    ]
    if not shown:
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 6), sharex=True)
    for label, r in shown:
        steps = [e["step"] for e in r.records if "dyt/saturated/final" in e]
        kind = "failed" if r.failed else "trained"
        st = colors[label]
        style = dict(color=st["color"], ls=st["ls"], lw=0.8 if r.failed else 1.6)
        if r.failed:
            style.update(marker="x", ms=4, markevery=max(1, len(steps) // 10))
        top.plot(
            steps,
            [100 * e["dyt/saturated/final"] for e in r.records if "dyt/saturated/final" in e],
            label=f"{label} lr {r.lr:g} s{r.seed} ({kind})",
            **style,
        )
        g = [
            (e["step"], e["grad/absmax/trunk"])
            for e in r.records
            if e.get("grad/absmax/trunk") is not None
        ]
        if g:
            bottom.plot([s for s, _ in g], [max(v, 1e-12) for _, v in g], **style)
    _axes(
        top,
        "",
        "final DyT saturated (%)",
        "DyT saturation: |alpha x| >= 9 (tanh's gradient exactly 0)",
    )
    _axes(bottom, "step", "largest gradient below the final norm", "", logy=True)
    _save(
        fig,
        out / "dyt_saturation.png",
        made,
        "DyT saturation vs step: a run that trained (thick) and one that failed (thin, x) per DyT "
        "arm; below, "
        "the largest gradient below the final norm (1e-12 stands for exactly 0: the absorbing "
        "state)",
    )


def log_z_curves(plt, res, colors, out: Path, made: list) -> None:
    """Output-logit divergence (Wortsman et al. 2023 Fig. 4): the mean log Z of the output logits
    (logits/log_z) vs step, every seed of each arm at its highest LR and at its best, where the arms
    differ in z-loss or weight decay (or the output soft-cap) and the runs logged log Z."""
    fields = (
        "train.z_loss",
        "optim.weight_decay",
        "optim.weight_decay_mode",
        "model.logit_softcap",
    )
    if not any(k in res.keys for k in fields) or not any(
        "logits/log_z" in rec for a in res.arms.values() for r in a.runs for rec in r.records
    ):
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True, squeeze=False)
    for ax, which in zip(axes[0], ("highest", "best"), strict=True):
        for label, a in res.arms.items():
            lr = (max(a.lrs) if a.lrs else None) if which == "highest" else a.best_lr
            named = False
            # one line per seed: split outcomes stay visible
            for r in a.at(lr) if lr is not None else []:
                pts = [
                    (rec["step"], rec["logits/log_z"])
                    for rec in r.records
                    if rec.get("logits/log_z") is not None
                ]
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        color=colors[label]["color"],
                        lw=0.9,
                        alpha=0.8,
                        marker="x" if r.failed else colors[label]["marker"],
                        ms=3,
                        ls=colors[label]["ls"],
                        label=None if named else f"{label} (lr {lr:g})",
                    )
                    named = True
        ax.axhline(0, color="gray", ls=":", lw=0.8)
        _axes(ax, "step", "mean log Z of the output logits", f"at each arm's {which} LR", legend=6)
    _save(
        fig,
        out / "log_z.png",
        made,
        "Output-logit divergence (Wortsman et al. 2023 Sec. 3.1.2): mean log Z of the output "
        "logits vs step at each "
        "arm's highest and best LR, every seed (x: failed under the study's rule); z-loss "
        "pulls log Z to 0",
    )


def _layer_matrix(run: Run, prefix: str):
    """(steps, [[value per logged step] per layer]) of a per-layer metric."""
    recs = [r for r in run.records if f"{prefix}0" in r and r[f"{prefix}0"] is not None]
    if not recs:
        return None
    n = max(int(k[len(prefix) :]) for k in recs[0] if k.startswith(prefix)) + 1
    return [r["step"] for r in recs], [
        [r.get(f"{prefix}{i}") or 0.0 for r in recs] for i in range(n)
    ]


def sensitivity_by_axis(plt, res, out: Path, made: list) -> None:
    """Wortsman et al. 2023 Fig. 1 style, along a numeric axis (width): one panel per group of arms
    that agree on everything but the axis, the mean final val loss over seeds (capped at L0) vs LR
    at each value of the axis; and a last panel with each group's LR sensitivity (mean over seeds,
    95% t CI) against the axis with its fitted slope (lab/trend.py)."""
    sens = [t for t in res.trends if t.what == "LR sensitivity"]
    if not sens:
        return
    axis = sens[0].axis
    sens = [t for t in sens if t.axis == axis]
    values = sorted({x for t in sens for x, _, _ in t.points})
    styles = arm_styles(res.arms)
    # the axis's values by marker and depth of colour (the colour stays the norm's)
    mark = {x: VARIANT_MARKERS[i % len(VARIANT_MARKERS)] for i, x in enumerate(values)}
    depth = {x: 0.35 + 0.65 * i / max(len(values) - 1, 1) for i, x in enumerate(values)}
    fig, axes = plt.subplots(1, len(sens) + 1, figsize=(4.2 * (len(sens) + 1), 3.6), squeeze=False)
    for ax in axes[0][1:-1]:  # the loss panels share a y axis; the last plots another quantity
        ax.sharey(axes[0][0])
    for i, (ax, t) in enumerate(zip(axes[0], sens, strict=False)):
        for label in t.arms:
            a = res.arms[label]
            cfg = a.runs[0].config
            at: dict = {}
            for r in a.runs:
                if r.finished and r.init_loss is not None:
                    at.setdefault(r.lr, []).append(capped(r, r.init_loss))
            xs = sorted(at)
            ax.plot(
                xs,
                [statistics.fmean(at[x]) for x in xs],
                marker=mark[cfg.get(axis)],
                ms=3,
                color=styles[label]["color"],
                ls=styles[label]["ls"],
                alpha=depth[cfg.get(axis)],
                label=f"{axis.rsplit('.', 1)[-1]} {cfg.get(axis):g}",
            )
        _axes(
            ax,
            "peak learning rate",
            "final val loss (mean over seeds)" if i == 0 else "",
            t.pair,
            logx=True,
        )
        ax.set_title(t.pair.replace(", ", "\n"), fontsize=8)
    ax = axes[0][-1]
    for t in sens:
        st = styles[t.arms[0]] if t.arms else dict(color="gray", ls="-", marker="o")
        pts = [(x, e, ci) for x, e, ci in t.points if e is not None]
        for x, e, ci in pts:
            ax.errorbar(
                [x],
                [e],
                yerr=[[e - ci[0]], [ci[1] - e]] if ci else None,
                fmt=st["marker"],
                color=st["color"],
                capsize=3,
            )
        slope = "no slope" if t.slope is None else f"{t.slope:+.3f}/doubling"
        line = dict(color=st["color"], ls=st["ls"], lw=1, label=f"{t.pair}: {slope}")
        if t.slope is not None and pts:
            xs = sorted(p[0] for p in pts)
            ax.plot(xs, [fitted(t, x) for x in xs], **line)
        else:
            ax.plot([], [], **line)
    _axes(
        ax, axis, "LR sensitivity (nats)", f"LR sensitivity by {axis}", logx=sens[0].log2, legend=6
    )
    ax.set_title(f"LR sensitivity by {axis}", fontsize=8)
    # below: the points fill the panel
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.set_xticks(values, [f"{x:g}" for x in values])
    ax.minorticks_off()
    _save(
        fig,
        out / "lr_sensitivity.png",
        made,
        f"LR sensitivity by {axis} (Wortsman et al. 2023, Fig. 1 style): the mean final val loss "
        f"over seeds vs LR at each {axis} (failed runs counted at their final loss, capped at L0), "
        "and each arm's LR sensitivity with its 95% t CI over seeds and the fitted slope per "
        "doubling (Knapp-Hartung); colour: the norm, line style: the placement, marker and depth "
        f"of colour: the {axis}",
    )


def trend_figure(plt, res, out: Path, made: list) -> None:
    """Each comparison's trend (lab/trend.py): the estimates with their 95% CIs against the axis,
    and the fitted line (LR sensitivity trends are drawn by sensitivity_by_axis)."""
    trends = [t for t in res.trends if t.what != "LR sensitivity"]
    if not trends:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, what, ylabel in (
        (axes[0], "LR50 ratio", "log10 LR50 ratio"),
        (axes[1], "loss difference", "loss difference (nats)"),
    ):
        for i, t in enumerate(x for x in trends if x.what == what):
            color = plt.cm.tab10(i % 10)
            pts = [(x, e, ci) for x, e, ci in t.points if e is not None]
            for x, e, ci in pts:
                ax.errorbar(
                    [x],
                    [e],
                    yerr=[[e - ci[0]], [ci[1] - e]] if ci else None,
                    fmt="o",
                    color=color,
                    capsize=3,
                )
            if t.slope is not None and pts:
                xs = sorted(p[0] for p in pts)
                ax.plot(
                    xs,
                    [fitted(t, x) for x in xs],
                    color=color,
                    lw=1,
                    label=f"{t.pair}: {t.slope:+.3f}",
                )
            else:
                ax.plot([], [], color=color, label=f"{t.pair}: no slope")
        ax.axhline(0, color="gray", lw=0.8, ls=":")
        axis = trends[0].axis
        drawn = any(e is not None for t in trends if t.what == what for _, e, _ in t.points)
        _axes(ax, axis, ylabel, f"{what} by {axis}", logx=trends[0].log2 and drawn, legend=6)
        values = sorted({x for t in trends for x, _, _ in t.points})
        ax.set_xticks(values, [f"{x:g}" for x in values])  # the values measured, not powers of ten
        ax.minorticks_off()
    _save(
        fig,
        out / "trend.png",
        made,
        "Trends: each comparison's estimate and 95% CI at every value of the axis, "
        "with the fitted slope (legend: slope per doubling)",
    )
