"""Inspect one run or put runs side by side: one page of their stability metrics, spikes by step.

    python -m normlab.inspect runs/default-rmsnorm-pre runs/default-layernorm-pre
    python -m normlab.inspect my-trainer-output      # a transformers Trainer's output_dir

Writes <out>/runs.png (a figure sheet: train and val loss, gradient norm, per-layer gradient norms,
update / parameter ratios, activation RMS by depth, the mean-energy fraction of the norms' inputs
by depth, the largest attention logit; every detected spike marked at its step) and <out>/page.md,
which embeds it under a table of the runs; prints the table. Runs of different configs are labelled
by what differs between them. <out> defaults to inspect/<first run's name> in the current
directory, beside runs/, never inside a run. A run is any folder the monitor wrote
(normlab/runs.py: a normlab run, a Monitor's folder, a Trainer's output folder, TensorBoard event
files); docs/usage.md has the metrics' glossary.
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

from normlab.files import replacing, write_text
from normlab.runs import MonitoredRun, read_run

STORAGE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}  # what exit code 4 means

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
PANELS = (
    ("loss", "train loss (line), val loss (dots), nats"),
    ("grad", "gradient norm (total, before clipping)"),
    ("grad_layers", "gradient norm by layer (darker: deeper)"),
    ("update", "update / parameter norm by layer, matrices"),
    ("act", "activation RMS by depth, first and last stats step"),
    ("mean", "norm inputs' mean-energy fraction by depth, first (dotted) and last stats step"),
    ("logit", "largest attention logit over layers"),
    ("lr", "learning rate"),
)


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit code 2 (as normlab's trainer and lab tools)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Run:
    """A monitored run as this page reads it: config, records, summary, its spikes' steps."""

    def __init__(self, path: Path):
        run: MonitoredRun = read_run(path)
        self.name, self.path, self.source = run.name, path, run.source
        self.config, self.records, self.summary = run.config, run.records, run.summary
        self.spikes = {key: run.spikes(key) for key in ("loss", "grad_norm")}

    def points(self, key: str) -> tuple[list[int], list[float]]:
        rows = [(r["step"], r[key]) for r in self.records if r.get(key) is not None]
        return [s for s, _ in rows], [v for _, v in rows]

    def layers(self, prefix: str) -> list[int]:
        found = {
            int(k[len(prefix) :])
            for r in self.records
            for k in r
            if k.startswith(prefix) and k[len(prefix) :].isdigit()
        }
        return sorted(found)

    def last(self, key: str, first: bool = False):
        rows = [r for r in self.records if r.get(key) is not None and r["step"] > 0]
        return (rows[0] if first else rows[-1]) if rows else None


def labels(runs: list[Run]) -> list[str]:
    """What differs between the runs' configs (all but the run's name and where it is written),
    else their names."""
    keys = sorted({k for r in runs for k in r.config} - {"log.name", "log.out_dir"})
    differ = [k for k in keys if len({repr(r.config.get(k)) for r in runs}) > 1]
    if not differ or len(runs) == 1:
        return [r.name for r in runs]
    return [", ".join(f"{k.split('.')[-1]}={r.config.get(k)}" for k in differ[:3]) for r in runs]


def rise(steps: list[int], values: list[float], step: int) -> float | None:
    """A value at `step` over the median of the five logged before it (None where unknown)."""
    before = [v for s, v in zip(steps, values, strict=True) if s < step][-5:]
    now = [v for s, v in zip(steps, values, strict=True) if s == step]
    if len(before) < 3 or not now:
        return None
    median = sorted(before)[len(before) // 2]
    return now[0] / median if median > 0 else None


def preceded(run: Run, step: int) -> str:
    """What the gradient norm and the largest attention logit did at a loss spike and at the last
    step each was logged before it, each against the median of the five before that."""
    out = []
    for name, (steps, values) in (
        ("grad norm", run.points("grad/norm")),
        ("max logit", _max_logit(run)),
    ):
        at = rise(steps, values, step)
        if at is not None and at >= 1.5:
            out.append(f"{name} x{at:.1f} with it")
        prior = [s for s in steps if s < step]
        up = rise(steps, values, prior[-1]) if prior else None
        if up is not None and up >= 1.5:
            out.append(f"{name} x{up:.1f} at step {prior[-1]} before it")
    return "; ".join(out) or "no logged signal rose with or before it"


def _by_depth(ax, run, prefix: str, color) -> None:
    """A metric over depth at the run's first (dotted) and last stats step."""
    depth = run.layers(prefix)
    for first, style in ((True, ":"), (False, "-")):
        rec = run.last(f"{prefix}{depth[-1]}", first) if depth else None
        if rec:
            values = [rec.get(f"{prefix}{d}") for d in depth]
            ax.plot(depth, values, style, color=color, marker="o", ms=3)


def _max_logit(run: Run) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for r in run.records:
        got = [v for k, v in r.items() if k.startswith("attn/logit_max/layer_") and v is not None]
        if got:
            steps.append(r["step"])
            values.append(max(got))
    return steps, values


def table(runs: list[Run], names: list[str]) -> list[str]:
    """The runs' outcomes: one row each (a run without normlab's summary: from its records)."""
    head = "run | outcome | last train loss | final val loss | best val loss | loss spikes (steps)"
    rows = [f"| {head} | tokens/s |"]
    rows.append("|---|---|---|---|---|---|---|")
    for run, name in zip(runs, names, strict=True):
        s = run.summary
        num = lambda x, f=".4f": "-" if x is None else format(x, f)  # noqa: E731
        spikes = run.spikes["loss"]
        shown = ", ".join(map(str, spikes[:8])) + (" ..." if len(spikes) > 8 else "") or "none"
        train = run.points("train/loss")[1]
        val = [v for st, v in zip(*run.points("val/loss"), strict=True) if st > 0]
        final = s.get("final_val_loss", val[-1] if val else None)
        best = s.get("best_val_loss", min(val) if val else None)
        status = s.get("status") or ("running" if run.source == "metrics.jsonl" else run.source)
        rows.append(
            f"| {name} | {status} | {num(train[-1] if train else None)} | {num(final)} | "
            f"{num(best)} | {shown} | {num(s.get('tokens_per_s'), ',.0f')} |"
        )
    return rows


def spike_lines(runs: list[Run], names: list[str]) -> list[str]:
    out = []
    for run, name in zip(runs, names, strict=True):
        for step in run.spikes["loss"][:8]:
            out.append(f"- {name}: loss spike at step {step}: {preceded(run, step)}")
        grad_only = sorted(set(run.spikes["grad_norm"]) - set(run.spikes["loss"]))
        if grad_only:
            shown = ", ".join(map(str, grad_only[:8])) + (" ..." if len(grad_only) > 8 else "")
            out.append(f"- {name}: gradient-norm spikes without a loss spike at steps {shown}")
    return out


def draw(runs: list[Run], names: list[str], path: Path) -> None:
    """The figure sheet: one panel per signal, runs in colours, spikes as crosses at their step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(4, 2, figsize=(13, 15))
    ax = dict(zip([p for p, _ in PANELS], axes.flat, strict=True))
    for (_, title), a in zip(PANELS, axes.flat, strict=True):
        a.set_title(title, fontsize=10)
        a.grid(alpha=0.3)
    for i, (run, name) in enumerate(zip(runs, names, strict=True)):
        c = COLORS[i % len(COLORS)]
        s, v = run.points("train/loss")
        ax["loss"].plot(s, v, color=c, lw=0.8, alpha=0.6, label=name)
        vs, vv = run.points("val/loss")
        ax["loss"].plot(vs, vv, "o-", color=c, ms=3, lw=1.2)
        spikes = [x for x in run.spikes["loss"] if x in s]
        ax["loss"].plot(spikes, [v[s.index(x)] for x in spikes], "x", color="k", ms=8, mew=2)
        g, gv = run.points("grad/norm")
        ax["grad"].plot(g, gv, color=c, lw=0.8)
        spikes = [x for x in run.spikes["grad_norm"] if x in g]
        ax["grad"].plot(spikes, [gv[g.index(x)] for x in spikes], "x", color="k", ms=8, mew=2)
        for key, prefix in (("grad_layers", "grad/norm/layer_"), ("update", "update/ratio/layer_")):
            layers = run.layers(prefix)
            for j, layer in enumerate(layers):
                ls, lv = run.points(f"{prefix}{layer}")
                shade = 0.3 + 0.7 * (j + 1) / len(layers)
                ax[key].plot(ls, lv, color=c, lw=0.9, alpha=shade)
        for key, prefix in (("act", "act/rms/layer_"), ("mean", "norm_in/mean_energy/layer_")):
            _by_depth(ax[key], run, prefix, c)
        ms, mv = _max_logit(run)
        ax["logit"].plot(ms, mv, "o-", color=c, ms=2, lw=1)
        ls, lv = run.points("train/lr")
        ax["lr"].plot(ls, lv, color=c, lw=1)
        for step in run.spikes["loss"]:  # every panel over steps marks the run's loss spikes
            for key in ("loss", "grad", "grad_layers", "update", "logit", "lr"):
                ax[key].axvline(step, color=c, ls="--", lw=0.8, alpha=0.5)
    for key in ("grad", "grad_layers", "update"):
        ax[key].set_yscale("log")
    for key in ("act", "mean"):
        ax[key].set_xlabel("layer")
        ax[key].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for key in ("loss", "grad", "grad_layers", "update", "logit", "lr"):
        ax[key].set_xlabel("step")
    for key, prefix in (("mean", "norm_in/mean_energy/layer_"), ("update", "update/ratio/layer_")):
        if not any(run.layers(prefix) for run in runs):
            ax[key].text(
                0.5, 0.5, "not logged by these runs", ha="center", transform=ax[key].transAxes
            )
    ax["loss"].legend(fontsize=8)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog="python -m normlab.inspect",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
    )
    p.add_argument(
        "runs", nargs="+", type=Path, help="run folders (runs/<name>, a Trainer's output_dir, ...)"
    )
    p.add_argument("--out", type=Path, default=None, help="folder for runs.png and page.md")
    a = p.parse_args(argv)
    try:
        runs = [Run(path) for path in a.runs]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = a.out or Path("inspect") / (runs[0].name + (f"+{len(runs) - 1}" if len(runs) > 1 else ""))
    if any(
        out.resolve() == r.path.resolve() or r.path.resolve() in out.resolve().parents for r in runs
    ):
        print(
            f"error: --out {out} is inside a run directory; give a folder of its own",
            file=sys.stderr,
        )
        return 2
    names = labels(runs)
    rows, spikes = table(runs, names), spike_lines(runs, names)
    try:
        out.mkdir(parents=True, exist_ok=True)
        draw(runs, names, out / "runs.png")
        page = (
            ["# " + " vs ".join(r.name for r in runs), "", *rows, "", *spikes, ""] if spikes else []
        )
        page = page or ["# " + " vs ".join(r.name for r in runs), "", *rows, ""]
        page += ["![stability metrics of the runs](runs.png)", ""]
        write_text(out / "page.md", "\n".join(page))
    except OSError as e:
        where = e.filename or out
        print(f"error: cannot write {where}: {e.strerror or e}", file=sys.stderr)
        return 4 if e.errno in STORAGE else 2
    print("\n".join(rows))
    if spikes:
        print("\n".join(spikes))
    print(f"page: {out / 'page.md'} (figure: {out / 'runs.png'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
