"""report.md: the table per arm, the sentences the numbers support, the figures and every run."""

from __future__ import annotations

import json
from pathlib import Path

from study.figures import figures
from study.runs import find_runs, group_arms
from study.stats import Arm, _max_series, _mean, _std, fmt


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


def write_report(paths: list[Path], out: Path) -> Path:
    """report.md and its figures in `out`, from the runs under `paths`; ValueError when there are none."""
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

