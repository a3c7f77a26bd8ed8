"""report.md: the table per arm, the sentences the numbers support, the figures and every run."""

from __future__ import annotations

import json
import time
from pathlib import Path

from omegaconf import OmegaConf

from study.figures import figures
from study.paired import Paired, mean_ci, paired
from study.runs import find_runs, group_arms
from study.stats import Arm, _max_series, _mean, fmt


def findings(arms: dict[str, Arm], keys: list[str], margin: float) -> list[str]:
    """Sentences that state what the numbers show (nothing here is decided in advance). A difference or an
    equivalence is only ever stated with its n, its CI and the verdict of the paired test."""
    out = []
    sens = {a.label: (a.sensitivity_per_seed(), mean_ci(list(a.sensitivity_per_seed().values())))
            for a in arms.values()}
    if any(v for v, _ in sens.values()):
        out.append("LR sensitivity per seed, mean (95% CI, n): " + "; ".join(
            f"{label} {fmt(m)} ({_ci(ci)}, n = {len(v)})" for label, (v, (m, ci)) in sens.items() if v) + ".")
    best = [(a.clipped(a.best_lr), a) for a in arms.values() if a.best_lr is not None]
    if best:
        _, a = min(best, key=lambda t: t[0])
        seeds = a.per_seed(a.best_lr)
        out.append(f"Lowest mean of min(final val loss, L0): **{a.label}** at lr {a.best_lr:g}, per seed "
                   + ", ".join(f"{v:.3f}" for _, v in sorted(seeds.items(), key=lambda t: str(t[0])))
                   + f" (n = {len(seeds)}).")
    by_pair: dict = {}
    for a, b, key, lr, p in comparisons(arms, keys, margin):
        by_pair.setdefault((a.label, b.label, key), (a, b, []))[2].append((lr, p))
    for (_, _, key), (a, b, rows) in by_pair.items():
        out.append(_pair_finding(a, b, key, rows))
        sa, sb = a.sensitivity_per_seed(), b.sensitivity_per_seed()
        if set(sa) & set(sb):
            out.append(f"LR sensitivity {a.label} - {b.label}: {paired(sa, sb, margin).describe()}.")
    for a in arms.values():
        c = a.outcomes()
        bad = {k: v for k, v in c.items() if k != "ok" and v}
        if bad:
            lrs = sorted({r.lr for r in a.runs if r.status != "ok"})
            out.append(f"**{a.label}**: " + ", ".join(f"{v} {k}" for k, v in bad.items())
                       + f" of {len(a.runs)} runs (at lr {', '.join(f'{x:g}' for x in lrs)}).")
    for a in arms.values():  # split outcomes at one LR: say so rather than average across them
        for lr in a.lrs:
            statuses = sorted({r.status for r in a.at(lr)})
            if len(statuses) > 1:
                out.append(f"**{a.label}** at lr {lr:g} splits: " + ", ".join(
                    f"seed {r.seed} {r.status}" + (f" {r.final:.3f}" if r.final is not None else "")
                    for r in sorted(a.at(lr), key=lambda r: str(r.seed))) + "; no mean is taken across them.")
    logit = {a.label: [_max_series(r, "attn/logit_max/") for r in a.at(max(a.lrs))] for a in arms.values()}
    logit = {k: [x for x in v if x is not None] for k, v in logit.items()}
    logit = {k: v for k, v in logit.items() if v}
    if len(logit) > 1:
        out.append("Max attention logit at each arm's highest LR, per seed: "
                   + "; ".join(f"{k} " + ", ".join(f"{x:.1f}" for x in v) for k, v in logit.items()) + ".")
    return out


def _ci(ci) -> str:
    return "no CI" if ci is None else f"{ci[0]:.3f}..{ci[1]:.3f}"


def wall_span(runs) -> float | None:
    """Seconds from the earliest run start (meta.json) to the latest run end (start + summary wall time)."""
    spans = []
    for r in runs:
        try:
            meta = json.loads((r.path / "meta.json").read_text())
            start = time.mktime(time.strptime(meta["started"][:19], "%Y-%m-%dT%H:%M:%S"))
        except (OSError, ValueError, KeyError):
            continue
        spans.append((start, start + float(r.summary.get("wall_time_s") or 0)))
    return max(e for _, e in spans) - min(s for s, _ in spans) if spans else None


DEFAULT_MARGIN = 0.02  # nats: the equivalence margin when the study file does not set one


def study_margin(paths: list[Path]) -> float:
    """The `equivalence_margin` of the first study.yaml among `paths`, else DEFAULT_MARGIN."""
    for p in paths:
        if (p / "study.yaml").is_file():
            value = (OmegaConf.load(p / "study.yaml") or {}).get("equivalence_margin")
            if value is not None:
                return float(value)
    return DEFAULT_MARGIN


def comparisons(arms: dict[str, Arm], keys: list[str], margin: float) -> list[tuple[Arm, Arm, str, float, Paired]]:
    """Every pair of arms that differ in exactly one config field, paired over seeds at each learning rate both
    ran: (A, B, the field, lr, Paired of A - B)."""
    out = []
    labels = list(arms)
    for i, la in enumerate(labels):
        for lb in labels[i + 1:]:
            a, b = arms[la], arms[lb]
            diff_keys = [k for k in keys if a.runs[0].config.get(k) != b.runs[0].config.get(k)]
            if len(diff_keys) != 1:
                continue
            for lr in [lr for lr in a.lrs if lr in b.lrs]:
                out.append((a, b, diff_keys[0], lr, paired(a.per_seed(lr), b.per_seed(lr), margin)))
    return out


def _pair_finding(a: Arm, b: Arm, key: str, rows: list[tuple[float, Paired]]) -> str:
    """The sentence for one pair of arms: at the LR where the two arms' mean loss is lowest (the LR a user would
    pick), the paired difference, its CI, the verdict and the minimum detectable difference."""
    usable = [(lr, p) for lr, p in rows if p.n > 0]
    if not usable:
        return f"{a.label} vs {b.label} (differ in {key}): no learning rate where both have a result."
    lr, p = min(usable, key=lambda t: _mean([a.clipped(t[0]), b.clipped(t[0])]))
    return f"{a.label} - {b.label} (differ in {key}) at lr {lr:g}: {p.describe()}."


def write_report(paths: list[Path], out: Path, margin: float | None = None) -> Path:
    """report.md and its figures in `out`, from the runs under `paths`; ValueError when there are none. The
    equivalence margin comes from `margin`, else the study file's `equivalence_margin`, else DEFAULT_MARGIN."""
    runs = find_runs(paths)
    if not runs:
        raise ValueError(f"no run directories (with config.yaml) under {', '.join(map(str, paths))}")
    margin = margin if margin is not None else study_margin(paths)
    keys, grouped = group_arms(runs)
    arms = {label: Arm(label, rs) for label, rs in grouped.items()}
    out.mkdir(parents=True, exist_ok=True)
    made = figures(arms, out)
    any_run = runs[0].summary
    lrs = sorted({r.lr for r in runs})
    seeds = sorted({r.config.get("train.seed") for r in runs})
    steps = runs[0].config.get("train.steps")
    l0_kind = ("the val loss at step 0, before the first update" if all(r.init_kind == "val" for r in runs)
               else "the first train loss (these runs predate the step-0 eval)")
    span = wall_span(runs)
    lines = [f"# Stability report: {', '.join(p.name for p in paths)}", "",
             (f"Wall time: {span / 60:.1f} min from the first run's start to the last run's end. " if span else "")
             + f"{len(runs)} runs in {len(arms)} arms (arms differ in: {', '.join(keys) or 'nothing'}); learning rates "
             f"{', '.join(f'{x:g}' for x in lrs)}; seeds {', '.join(map(str, seeds))}; {steps} steps per run.", "",
             "Outcomes, judged on the whole val curve: `ok` learned and kept it; `plateau` no eval got "
             "`log.plateau_margin` nats below the unigram entropy (learned token frequencies only); `unstable` "
             "learned, then ended `log.blowup_margin` above its best or above L0; `diverged` non-finite loss or "
             "gradient. "
             f"L0 is {l0_kind}. Per run the comparisons use v = min(final val loss, L0), a diverged run counting "
             "as L0. "
             "LR sensitivity (Wortsman et al. 2023) per seed = mean over the LR grid of v(lr) - min v; lower is more "
             "robust. Arms are compared paired over seeds (runs of two arms with the same seed share init and "
             "batches): mean difference with its 95% t CI, a TOST equivalence test at the margin "
             f"+-{margin:g} nats, and the minimum detectable difference at 80% power. Spike score (OLMo 2) = % of "
             f"steps at least k={any_run.get('spike_k')} std from the mean of the trailing "
             f"{any_run.get('spike_window')} steps (the paper uses k=7 over 1000 steps; scaled down for short "
             "runs).", "",
             "| arm | best LR | v at best LR, per seed | max LR with all seeds ok | LR sensitivity, mean (95% CI) | "
             "ok / plateau / unstable / diverged / failed | spike score loss / grad norm (%) | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for a in arms.values():
        per_seed = a.per_seed(a.best_lr) if a.best_lr else {}
        c = a.outcomes()
        m, ci = mean_ci(list(a.sensitivity_per_seed().values()))
        lines.append(f"| {a.label} | {fmt(a.best_lr, 'g')} | "
                     f"{', '.join(f'{v:.3f}' for _, v in sorted(per_seed.items(), key=lambda t: str(t[0]))) or '-'} | "
                     f"{fmt(a.max_lr_ok, 'g')} | {fmt(m)} ({_ci(ci)}) | {c['ok']} / {c['plateau']} / {c['unstable']} / "
                     f"{c['diverged']} / {c['failed'] + c['interrupted']} | "
                     f"{fmt(a.summary_mean('spike_score/loss'), '.2f')} / "
                     f"{fmt(a.summary_mean('spike_score/grad_norm'), '.2f')} | {fmt(a.tokens_per_s(), ',.0f')} |")
    pairs = comparisons(arms, keys, margin)
    if pairs:
        lines += ["", "## Paired comparisons", "",
                  f"A - B of v per seed; verdict by TOST at +-{margin:g} nats and the 95% CI; MDE: minimum detectable "
                  "difference at 80% power for this n.", "",
                  "| A | B | differ in | lr | n | A - B | 95% CI | verdict | TOST p | MDE |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for a, b, key, lr, p in pairs:
            lines.append(f"| {a.label} | {b.label} | {key} | {lr:g} | {p.n} | {fmt(p.mean, '+.3f')} | "
                         f"{_ci(p.ci)} | {p.verdict} | {fmt(p.p_tost, '.3g')} | {fmt(p.mde)} |")
    lines += ["", "## What the numbers show", ""] + [f"- {s}" for s in findings(arms, keys, margin)]
    lines += ["", "## Figures", ""]
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

