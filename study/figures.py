"""The report's figures, drawn from arms (matplotlib, Agg backend): loss and grad-norm curves per arm, the
stability map, per-layer gradient heatmaps, activation RMS by depth, attention-logit growth."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from study.runs import Run
from study.stats import Arm, _max_series, _mean, fmt


def _smooth(ys: list[float], n: int) -> list[float]:
    out, acc = [], None
    alpha = 2 / (n + 1)
    for y in ys:
        acc = y if acc is None else alpha * y + (1 - alpha) * acc
        out.append(acc)
    return out


def _axes(ax, xlabel: str, ylabel: str, title: str, logx: bool = False, logy: bool = False, legend: int = 7):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.legend(fontsize=legend)


def _save(fig, path: Path, made: list, caption: str) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    made.append((path.name, caption))


def figures(arms: dict[str, Arm], out: Path) -> list[tuple[str, str]]:
    """Every figure of the report, drawn into `out`; [(file name, caption)] of those made."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {label: plt.cm.tab10(i % 10) for i, label in enumerate(arms)}
    made: list[tuple[str, str]] = []
    for draw in (loss_curves, grad_norm_curves, stability_map, grad_heatmaps, act_rms_depth, attn_logit_max):
        draw(plt, arms, colors, out, made)
    return made


def _curves(plt, arms, colors, out: Path, made: list, key: str, fname: str, title: str, logy: bool) -> None:
    """One panel per learning rate: a metric's median over seeds per arm, with the min..max band."""
    lrs = sorted({lr for a in arms.values() for lr in a.lrs})
    l0 = _mean([a.l0 for a in arms.values()])
    steps_total = max((len(r.records) for a in arms.values() for r in a.runs), default=1)
    fig, axes = plt.subplots(1, len(lrs), figsize=(3.2 * len(lrs), 3.2), sharey=True, squeeze=False)
    lowest = math.inf
    for ax, lr in zip(axes[0], lrs, strict=True):
        for label, a in arms.items():
            for i, r in enumerate(a.at(lr)):  # one thin line per seed: split outcomes stay visible
                pts = [(rec["step"], rec[key]) for rec in r.records if rec.get(key) is not None and rec["step"] > 0]
                if pts:
                    ys = _smooth([v for _, v in pts], max(1, steps_total // 50))
                    lowest = min(lowest, min(ys))
                    ax.plot([s for s, _ in pts], ys, color=colors[label], lw=0.9, alpha=0.8,
                            label=label if i == 0 else None)
        ax.set_title(f"lr {lr:g}")
        ax.set_xlabel("step")
        if logy:
            ax.set_yscale("log")
    if not logy and l0 and math.isfinite(lowest):
        axes[0][0].set_ylim(lowest - 0.05 * (l0 - lowest), l0 * 1.05)  # shared: diverging spikes are cut
    axes[0][0].set_ylabel(f"{title}\n(one line per seed, smoothed)")
    axes[0][-1].legend(fontsize=7)
    _save(fig, out / fname, made, f"{title} per arm and learning rate")


def loss_curves(plt, arms, colors, out: Path, made: list) -> None:
    _curves(plt, arms, colors, out, made, "train/loss", "loss_curves.png", "train loss", logy=False)


def grad_norm_curves(plt, arms, colors, out: Path, made: list) -> None:
    _curves(plt, arms, colors, out, made, "grad/norm", "grad_norm_curves.png", "grad norm (before clipping)", logy=True)


def stability_map(plt, arms, colors, out: Path, made: list) -> None:
    """Final val loss (min(L, L0), mean over seeds) vs learning rate per arm; diverged and plateau runs marked."""
    l0 = _mean([a.l0 for a in arms.values()])
    entropy = _mean([r.summary.get("unigram_entropy") for a in arms.values() for r in a.runs])
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, a in arms.items():
        xs = [lr for lr in a.lrs if a.clipped(lr) is not None]
        ax.plot(xs, [a.clipped(lr) for lr in xs], color=colors[label], label=f"{label} (mean over seeds)", lw=1.2)
        for r in a.runs:  # every seed is drawn: a split outcome shows as two points, never as a mean +- std
            if r.value is None:
                continue
            marker = {"diverged": "x", "plateau": "o", "collapsed": "s", "unstable": "^"}.get(r.status, ".")
            style = (dict(facecolors="none", edgecolors=colors[label])
                     if r.status in ("plateau", "collapsed", "unstable")
                     else dict(color=colors[label]))
            ax.scatter([r.lr], [r.value], marker=marker, s=60 if marker != "." else 40, zorder=5, **style)
    if entropy:
        ax.axhline(entropy, color="gray", ls="--", lw=1, label="unigram entropy")
    if l0:
        ax.axhline(l0, color="gray", ls=":", lw=1, label="loss at init (L0)")
    _axes(ax, "peak learning rate", "final val loss, min(L, L0), mean over seeds",
          "stability map: every seed (x diverged, s collapsed, o plateau, ^ unstable)", logx=True)
    _save(fig, out / "stability_map.png", made,
          "min(final val loss, L0) vs learning rate: every seed a marker, the line the mean over seeds")


def grad_heatmaps(plt, arms, colors, out: Path, made: list) -> None:
    """Per-layer gradient norm (layer x step) at each arm's best LR, first seed, on one color scale."""
    grids = {}
    for label, a in arms.items():
        run = next((r for r in a.at(a.best_lr)), None) if a.best_lr else None
        grid = _layer_matrix(run, "grad/norm/layer_") if run else None
        if grid:
            grids[label] = (grid[0], [[math.log10(max(v, 1e-12)) for v in row] for row in grid[1]])
    values = [v for _, mat in grids.values() for row in mat for v in row]
    fig, axes = plt.subplots(1, len(arms), figsize=(3.4 * len(arms) + 1, 3), squeeze=False)
    im = None
    for ax, (label, a) in zip(axes[0], arms.items(), strict=True):
        if label in grids:
            steps, mat = grids[label]
            im = ax.imshow(mat, aspect="auto", origin="lower", cmap="viridis", vmin=min(values), vmax=max(values),
                           extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, len(mat) - 0.5))  # one step: 1 wide
            ax.set_yticks(range(len(mat)))
        ax.set_title(f"{label} (lr {fmt(a.best_lr, 'g')})", fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("layer")
    if im is not None:  # one color scale for all arms, so they compare
        fig.colorbar(im, ax=list(axes[0]), label="log10 grad norm")
    _save(fig, out / "grad_heatmaps.png", made,
          "per-layer gradient norm (layer x step) at each arm's best LR, first seed")


def act_rms_depth(plt, arms, colors, out: Path, made: list) -> None:
    """RMS of the residual stream after each block, at step 1 and at the end (median over seeds, best LR)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, a in arms.items():
        mats = [_layer_matrix(r, "act/rms/layer_") for r in a.at(a.best_lr)] if a.best_lr else []
        mats = [m for m in mats if m]
        if mats:
            last = [statistics.median(m[1][i][-1] for m in mats) for i in range(len(mats[0][1]))]
            first = [statistics.median(m[1][i][0] for m in mats) for i in range(len(mats[0][1]))]
            ax.plot(range(len(last)), last, marker="o", color=colors[label], label=f"{label} (end)")
            ax.plot(range(len(first)), first, ls=":", color=colors[label], label=f"{label} (step 1)")
    layers = max((int(r.config.get("model.n_layers", 1)) for a in arms.values() for r in a.runs), default=1)
    ax.set_xticks(range(layers))
    _axes(ax, "layer", "RMS of the residual stream after the block", "activation RMS by depth at each arm's best LR",
          logy=True, legend=6)
    _save(fig, out / "act_rms_depth.png", made, "activation RMS by depth (step 1 and the last logged step)")


def attn_logit_max(plt, arms, colors, out: Path, made: list) -> None:
    """The largest attention logit a run saw, vs learning rate (Wortsman et al. 2023's logit growth)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, a in arms.items():
        xs, ys = [], []
        for lr in a.lrs:
            v = _mean([_max_series(r, "attn/logit_max/") for r in a.at(lr)])
            if v is not None:
                xs.append(lr)
                ys.append(v)
        ax.plot(xs, ys, marker="o", color=colors[label], label=label)
    _axes(ax, "peak learning rate", "max attention logit over steps and layers",
          "attention-logit growth (Wortsman et al. 2023)", logx=True, logy=True)
    _save(fig, out / "attn_logit_max.png", made, "max attention logit vs learning rate")


def _layer_matrix(run: Run, prefix: str):
    """(steps, [[value per logged step] per layer]) of a per-layer metric."""
    recs = [r for r in run.records if f"{prefix}0" in r and r[f"{prefix}0"] is not None]
    if not recs:
        return None
    n = max(int(k[len(prefix):]) for k in recs[0] if k.startswith(prefix)) + 1
    return [r["step"] for r in recs], [[r.get(f"{prefix}{i}") or 0.0 for r in recs] for i in range(n)]

