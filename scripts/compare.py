"""Compare runs: read run directories (or study directories holding runs/) and write a stability report.

    python scripts/compare.py studies/norm-placement-lr [other run or study dirs...] [--out DIR]

Runs are grouped into arms by every config field that differs between them, except the learning rate
and the seed; the learning rate is the x axis and seeds give the spread. Writes report.md and PNG
figures into --out (default: the first directory). Reads only files; never a live process.

Per arm: best LR (lowest mean final val loss), the final val loss there (mean +- std over seeds), the
largest LR at which every seed finished `ok`, LR sensitivity (Wortsman et al. 2023: mean over the LR
grid of min(L(lr), L0) - L*, L0 the loss at initialization and L* the arm's best), outcome counts,
spike scores (OLMo 2, parameters as the runs logged them) and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omegaconf import OmegaConf  # noqa: E402

from training import monitor  # noqa: E402
from training.runinfo import read_metrics, series  # noqa: E402

IGNORED = {"optim.lr", "train.seed", "log.name", "log.out_dir", "train.threads", "data.root", "log.wandb"}
OUTCOMES = (*monitor.OUTCOMES, "failed")  # failed: crashed without a summary (sweep.json has the error)


@dataclass
class Run:
    name: str
    path: Path
    config: dict  # flattened: {"model.norm": "rmsnorm", ...}
    summary: dict
    records: list[dict]

    @property
    def lr(self) -> float:
        return float(self.config["optim.lr"])

    @property
    def status(self) -> str:
        return self.summary.get("status", "failed")

    @property
    def final(self) -> float | None:
        """Final val loss of a run that finished without diverging."""
        v = self.summary.get("final_val_loss")
        return v if self.status in ("ok", "plateau") and v is not None else None

    @property
    def init_loss(self) -> float | None:
        first = series(self.records[:1], "train/loss")
        return first[0] if first else None


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run directory (one with config.yaml) given directly, or inside a study's runs/ folder."""
    dirs = []
    for p in paths:
        if (p / "config.yaml").is_file():
            dirs.append(p)
        else:
            base = p / "runs" if (p / "runs").is_dir() else p
            dirs += sorted(d for d in base.iterdir() if (d / "config.yaml").is_file()) if base.is_dir() else []
    runs = []
    for d in dirs:
        try:
            summary = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {"status": "failed"}  # crashed before writing its summary
        config = _flat(OmegaConf.to_container(OmegaConf.load(d / "config.yaml")))
        runs.append(Run(d.name, d, config, summary, read_metrics(d / "metrics.jsonl")))
    return runs


def arm_label(config: dict, keys: list[str]) -> str:
    parts = [str(config[k]) if k in ("model.norm", "model.placement") else f"{k.rsplit('.', 1)[-1]}={config[k]}"
             for k in keys]
    return "/".join(parts) or "all"


def group_arms(runs: list[Run]) -> tuple[list[str], dict[str, list[Run]]]:
    """(the config keys that define arms, {arm label: runs}) in a stable order."""
    keys = sorted({k for r in runs for k in r.config if k not in IGNORED
                   and len({json.dumps(x.config.get(k)) for x in runs}) > 1},
                  key=lambda k: (k not in ("model.norm", "model.placement"), k != "model.norm", k))
    arms: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: [str(r.config.get(k)) for k in keys]):
        arms.setdefault(arm_label(r.config, keys), []).append(r)
    return keys, arms


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _std(xs):
    xs = [x for x in xs if x is not None]
    return statistics.stdev(xs) if len(xs) > 1 else None


@dataclass
class Arm:
    label: str
    runs: list[Run]
    lrs: list[float] = field(init=False)
    l0: float | None = field(init=False)

    def __post_init__(self):
        self.lrs = sorted({r.lr for r in self.runs})
        self.l0 = _mean([r.init_loss for r in self.runs])

    def at(self, lr: float) -> list[Run]:
        return [r for r in self.runs if r.lr == lr]

    def clipped(self, lr: float) -> float | None:
        """Mean over seeds of min(L(lr), L0); a run that diverged counts as L0."""
        if self.l0 is None:
            return None
        vals = [min(r.final, self.l0) if r.final is not None else self.l0
                for r in self.at(lr) if r.status in ("ok", "plateau", "diverged")]
        return _mean(vals)

    @property
    def best_lr(self) -> float | None:
        scored = [(self.clipped(lr), lr) for lr in self.lrs if self.clipped(lr) is not None]
        return min(scored)[1] if scored else None

    @property
    def sensitivity(self) -> float | None:
        vals = [self.clipped(lr) for lr in self.lrs]
        vals = [v for v in vals if v is not None]
        return statistics.fmean(v - min(vals) for v in vals) if vals else None

    @property
    def max_lr_ok(self) -> float | None:
        ok = [lr for lr in self.lrs if self.at(lr) and all(r.status == "ok" for r in self.at(lr))]
        return max(ok) if ok else None

    def finals(self, lr: float) -> list[float]:
        return [r.final for r in self.at(lr) if r.final is not None]

    def outcomes(self) -> dict[str, int]:
        counts = {o: 0 for o in OUTCOMES}
        for r in self.runs:
            counts[r.status if r.status in counts else "failed"] += 1
        return counts

    def summary_mean(self, key: str) -> float | None:
        return _mean([r.summary.get(key) for r in self.runs if r.status in ("ok", "plateau")])

    def tokens_per_s(self) -> float | None:
        v = [r.summary.get("tokens_per_s") for r in self.runs if r.summary.get("tokens_per_s")]
        return statistics.median(v) if v else None


def fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def findings(arms: dict[str, Arm], keys: list[str]) -> list[str]:
    """Sentences that state what the numbers show (nothing here is decided in advance)."""
    out = []
    sens = {a.label: a.sensitivity for a in arms.values() if a.sensitivity is not None}
    if len(sens) > 1:
        lo, hi = min(sens, key=sens.get), max(sens, key=sens.get)
        out.append(f"Lowest LR sensitivity: **{lo}** ({sens[lo]:.3f} nats); highest: **{hi}** ({sens[hi]:.3f}).")
    best = [(a.clipped(a.best_lr), a) for a in arms.values() if a.best_lr is not None]
    if best:
        loss, a = min(best, key=lambda t: t[0])
        f = a.finals(a.best_lr)
        out.append(f"Lowest final val loss: **{a.label}** at lr {a.best_lr:g}: {fmt(_mean(f))}"
                   + (f" +- {fmt(_std(f))}" if _std(f) is not None else "") + f" over {len(f)} seed(s).")
    labels = list(arms)
    for i, la in enumerate(labels):
        for lb in labels[i + 1:]:
            a, b = arms[la], arms[lb]
            diff_keys = [k for k in keys if a.runs[0].config.get(k) != b.runs[0].config.get(k)]
            if len(diff_keys) == 1:
                out.append(_pair_finding(a, b, diff_keys[0]))
    for a in arms.values():
        c = a.outcomes()
        bad = {k: v for k, v in c.items() if k != "ok" and v}
        if bad:
            lrs = sorted({r.lr for r in a.runs if r.status != "ok"})
            out.append(f"**{a.label}**: " + ", ".join(f"{v} {k}" for k, v in bad.items())
                       + f" of {len(a.runs)} runs (at lr {', '.join(f'{x:g}' for x in lrs)}).")
    logit = {a.label: _mean([_max_series(r, "attn/logit_max/") for r in a.at(max(a.lrs))]) for a in arms.values()}
    logit = {k: v for k, v in logit.items() if v is not None}
    if len(logit) > 1:
        out.append("Max attention logit at each arm's highest LR: "
                   + ", ".join(f"{k} {v:.1f}" for k, v in sorted(logit.items(), key=lambda t: t[1])) + ".")
    return out


def _pair_finding(a: Arm, b: Arm, key: str) -> str:
    """Is the difference between two arms that differ in one field larger than the seed-to-seed spread?"""
    common = [lr for lr in a.lrs if lr in b.lrs and a.finals(lr) and b.finals(lr)]
    if not common:
        return f"{a.label} vs {b.label}: no learning rate where both finished."
    exceed = []
    for lr in common:
        d = _mean(a.finals(lr)) - _mean(b.finals(lr))
        spread = max(s for s in (_std(a.finals(lr)), _std(b.finals(lr)), 0.0) if s is not None)
        exceed.append((lr, d, spread, spread > 0 and abs(d) > 2 * spread))
    lr_best = b.best_lr if b.best_lr in common else common[0]
    _, d, spread, big = next(e for e in exceed if e[0] == lr_best)
    n_big = sum(e[3] for e in exceed)
    head = f"{a.label} vs {b.label} (differ in {key}): at lr {lr_best:g} the final val loss difference is {d:+.3f} nats"
    if spread == 0:
        return head + " (one seed per LR: no seed-to-seed spread to compare it with)."
    verdict = "exceeds" if big else "is within"
    return (f"{head} (seed std {spread:.3f}), which {verdict} 2x the seed-to-seed spread; across the "
            f"{len(common)} LRs where both finished it exceeds it at {n_big}.")


def _max_series(run: Run, prefix: str) -> float | None:
    vals = [v for rec in run.records for k, v in rec.items() if k.startswith(prefix) and v is not None]
    return max(vals) if vals else None


# ---------------------------------------------------------------------------------------------- figures
def _smooth(ys: list[float], n: int) -> list[float]:
    out, acc = [], None
    alpha = 2 / (n + 1)
    for y in ys:
        acc = y if acc is None else alpha * y + (1 - alpha) * acc
        out.append(acc)
    return out


def _band(runs: list[Run], key: str, smooth: int):
    """(steps, median, low, high) over seeds of a per-step metric (runs cut to the shortest)."""
    curves = []
    for r in runs:
        pts = [(rec["step"], rec[key]) for rec in r.records if rec.get(key) is not None]
        if pts:
            curves.append(pts)
    if not curves:
        return None
    n = min(len(c) for c in curves)
    steps = [s for s, _ in curves[0][:n]]
    ys = [_smooth([v for _, v in c[:n]], smooth) for c in curves]
    cols = list(zip(*ys, strict=True))
    return steps, [statistics.median(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {label: plt.cm.tab10(i % 10) for i, label in enumerate(arms)}
    made = []
    lrs = sorted({lr for a in arms.values() for lr in a.lrs})
    l0 = _mean([a.l0 for a in arms.values()])
    entropy = _mean([r.summary.get("unigram_entropy") for a in arms.values() for r in a.runs])
    steps_total = max((len(r.records) for a in arms.values() for r in a.runs), default=1)

    for key, fname, title, logy in (("train/loss", "loss_curves.png", "train loss", False),
                                    ("grad/norm", "grad_norm_curves.png", "grad norm (before clipping)", True)):
        fig, axes = plt.subplots(1, len(lrs), figsize=(3.2 * len(lrs), 3.2), sharey=True, squeeze=False)
        lowest = math.inf
        for ax, lr in zip(axes[0], lrs, strict=True):
            for label, a in arms.items():
                band = _band(a.at(lr), key, max(1, steps_total // 50))
                if band:
                    s, med, lo, hi = band
                    lowest = min(lowest, min(lo))
                    ax.plot(s, med, color=colors[label], label=label, lw=1.2)
                    ax.fill_between(s, lo, hi, color=colors[label], alpha=0.2, lw=0)
            ax.set_title(f"lr {lr:g}")
            ax.set_xlabel("step")
            if logy:
                ax.set_yscale("log")
        if not logy and l0 and math.isfinite(lowest):
            axes[0][0].set_ylim(lowest - 0.05 * (l0 - lowest), l0 * 1.05)  # shared: diverging spikes are cut
        axes[0][0].set_ylabel(f"{title}\n(median over seeds, band min..max)")
        axes[0][-1].legend(fontsize=7)
        _save(fig, out / fname, made, f"{title} per arm and learning rate")

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, a in arms.items():
        xs = [lr for lr in a.lrs if a.clipped(lr) is not None]
        ax.errorbar(xs, [a.clipped(lr) for lr in xs], yerr=[_std(a.finals(lr)) or 0 for lr in xs], marker="o",
                    color=colors[label], label=label, capsize=3, lw=1.2)
        for r in a.runs:
            if r.status == "diverged" and a.l0:
                ax.scatter([r.lr], [a.l0], marker="x", color=colors[label], s=60, zorder=5)
            elif r.status == "plateau":
                ax.scatter([r.lr], [r.final], marker="o", facecolors="none", edgecolors=colors[label], s=90, zorder=5)
    if entropy:
        ax.axhline(entropy, color="gray", ls="--", lw=1, label="unigram entropy")
    if l0:
        ax.axhline(l0, color="gray", ls=":", lw=1, label="loss at init (L0)")
    _axes(ax, "peak learning rate", "final val loss, min(L, L0), mean over seeds",
          "stability map (x: diverged, hollow: plateau)", logx=True)
    _save(fig, out / "stability_map.png", made, "final val loss vs learning rate per arm (the stability map)")

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
                           extent=(steps[0], steps[-1], -0.5, len(mat) - 0.5))
            ax.set_yticks(range(len(mat)))
        ax.set_title(f"{label} (lr {fmt(a.best_lr, 'g')})", fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("layer")
    if im is not None:  # one color scale for all arms, so they compare
        fig.colorbar(im, ax=list(axes[0]), label="log10 grad norm")
    _save(fig, out / "grad_heatmaps.png", made,
          "per-layer gradient norm (layer x step) at each arm's best LR, first seed")

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
    return made


def _layer_matrix(run: Run, prefix: str):
    """(steps, [[value per logged step] per layer]) of a per-layer metric."""
    recs = [r for r in run.records if f"{prefix}0" in r and r[f"{prefix}0"] is not None]
    if not recs:
        return None
    n = max(int(k[len(prefix):]) for k in recs[0] if k.startswith(prefix)) + 1
    return [r["step"] for r in recs], [[r.get(f"{prefix}{i}") or 0.0 for r in recs] for i in range(n)]


# ---------------------------------------------------------------------------------------------- report
def report(paths: list[Path], out: Path) -> Path:
    runs = find_runs(paths)
    if not runs:
        raise ValueError(f"no run directories (with config.yaml) under {', '.join(map(str, paths))}")
    keys, grouped = group_arms(runs)
    arms = {label: Arm(label, rs) for label, rs in grouped.items()}
    out.mkdir(parents=True, exist_ok=True)
    made = figures(arms, out)
    any_run = runs[0].summary
    lrs = sorted({r.lr for r in runs})
    seeds = sorted({r.config.get("train.seed") for r in runs})
    steps = runs[0].config.get("train.steps")
    lines = [f"# Stability report: {', '.join(p.name for p in paths)}", "",
             f"{len(runs)} runs in {len(arms)} arms (arms differ in: {', '.join(keys) or 'nothing'}); learning rates "
             f"{', '.join(f'{x:g}' for x in lrs)}; seeds {', '.join(map(str, seeds))}; {steps} steps per run.", "",
             "Outcomes: `ok` finished and learned; `plateau` finished within `log.plateau_margin` nats of the unigram "
             "entropy (learned token frequencies only); `diverged` non-finite loss or gradient. LR sensitivity "
             "(Wortsman et al. 2023) = mean over the LR grid of min(L(lr), L0) - L*, with L0 the loss at "
             "initialization and L* the arm's best; lower is more robust. Spike score (OLMo 2) = % of steps at least "
             f"k={any_run.get('spike_k')} std from the mean of the trailing {any_run.get('spike_window')} steps "
             "(the paper uses k=7 over 1000 steps; scaled down for short runs).", "",
             "| arm | best LR | final val loss at best LR | max LR with all seeds ok | LR sensitivity | "
             "ok / plateau / diverged / failed | spike score loss / grad norm (%) | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for a in arms.values():
        f = a.finals(a.best_lr) if a.best_lr else []
        c = a.outcomes()
        loss = f"{fmt(_mean(f))} +- {fmt(_std(f))}" if len(f) > 1 else fmt(_mean(f))
        lines.append(f"| {a.label} | {fmt(a.best_lr, 'g')} | {loss} | {fmt(a.max_lr_ok, 'g')} | "
                     f"{fmt(a.sensitivity)} | {c['ok']} / {c['plateau']} / {c['diverged']} / "
                     f"{c['failed'] + c['interrupted']} | {fmt(a.summary_mean('spike_score/loss'), '.2f')} / "
                     f"{fmt(a.summary_mean('spike_score/grad_norm'), '.2f')} | {fmt(a.tokens_per_s(), ',.0f')} |")
    lines += ["", "## What the numbers show", ""] + [f"- {s}" for s in findings(arms, keys)] + ["", "## Figures", ""]
    for fname, caption in made:
        lines += [f"**{caption}**", "", f"![{caption}]({fname})", ""]
    lines += ["## Runs", "", "| run | status | final val loss | best val loss | diverged at | L0 | tokens/s |",
              "|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: r.name):
        s = r.summary
        lines.append(f"| {r.name} | {r.status} | {fmt(s.get('final_val_loss'))} | {fmt(s.get('best_val_loss'))} | "
                     f"{fmt(s.get('diverged_at'), 'd')} | {fmt(r.init_loss)} | {fmt(s.get('tokens_per_s'), ',.0f')} |")
    for p in paths:
        index = p / "sweep.json"
        if index.is_file():
            failed = [e for e in json.loads(index.read_text())["runs"] if e.get("status") == "failed"]
            for e in failed:
                lines.append(f"| {e['name']} | failed (exit {e['exit_code']}): {e.get('error', '')} | | | | | |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="run directories or study directories")
    p.add_argument("--out", type=Path, default=None, help="where report.md and the figures go (default: first dir)")
    a = p.parse_args(argv)
    missing = [d for d in a.dirs if not d.is_dir()]
    if missing:
        print(f"error: {missing[0]} is not a directory", file=sys.stderr)
        return 2
    try:
        path = report(a.dirs, a.out or a.dirs[0])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
