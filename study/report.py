"""report.md: the table per arm, the sentences the numbers support, the figures and every run."""

from __future__ import annotations

import itertools
import json
import math
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
    """Seconds during which at least one run was in flight: the union of the runs' [start (meta.json), start +
    summary wall time] intervals, so a study run in stages at different times is not charged for the gap."""
    spans = []
    for r in runs:
        try:
            meta = json.loads((r.path / "meta.json").read_text())
            start = time.mktime(time.strptime(meta["started"][:19], "%Y-%m-%dT%H:%M:%S"))
        except (OSError, ValueError, KeyError):
            continue
        spans.append((start, start + float(r.summary.get("wall_time_s") or 0)))
    if not spans:
        return None
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        total += max(0.0, e - max(s, end))
        end = max(end, e)
    return total


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


def _at_users_lr(a: Arm, b: Arm, rows: list[tuple[float, Paired]]) -> tuple[float, Paired] | None:
    """The row at the LR where the two arms' mean v is lowest (the LR a user would pick); None if no LR has both."""
    usable = [(lr, p) for lr, p in rows if p.n > 0]
    return min(usable, key=lambda t: _mean([a.clipped(t[0]), b.clipped(t[0])])) if usable else None


def _pair_finding(a: Arm, b: Arm, key: str, rows: list[tuple[float, Paired]]) -> str:
    """The sentence for one pair of arms: at the LR where the two arms' mean loss is lowest (the LR a user would
    pick), the paired difference, its CI, the verdict and the minimum detectable difference."""
    picked = _at_users_lr(a, b, rows)
    if picked is None:
        return f"{a.label} vs {b.label} (differ in {key}): no learning rate where both have a result."
    lr, p = picked
    return f"{a.label} - {b.label} (differ in {key}) at lr {lr:g}: {p.describe()}."


def _same(x, y) -> bool:
    """Config values equal as the YAML meant them (0.1 == 0.1, 12 == 12.0, but False != 0)."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y))
    return float(x) == float(y) if numbers else x == y


def claim_pairs(claim: dict, arms: dict[str, Arm], keys: list[str]) -> list[tuple[Arm, Arm]]:
    """The arm pairs (A, B) a claim compares: A has claim.a's values, B claim.b's; a field named on one side only
    takes the same value on the other; fields named on neither side must agree (one pair per combination)."""
    sides = {"a": {**claim["b"], **claim["a"]}, "b": {**claim["a"], **claim["b"]}}

    def fits(arm: Arm, side: str) -> bool:
        return all(_same(arm.runs[0].config.get(k), v) for k, v in sides[side].items())

    free = [k for k in keys if k not in sides["a"]]
    return [(A, B) for A in arms.values() if fits(A, "a") for B in arms.values()
            if B is not A and fits(B, "b") and all(_same(A.runs[0].config.get(k), B.runs[0].config.get(k))
                                                   for k in free)]


def agreement(expect: str, p: Paired) -> str:
    """Whether a paired comparison agrees with a claim that A is higher / lower / the same as B: decided by the
    verdict alone (a difference needs a CI excluding 0, sameness a TOST pass); otherwise `cannot tell`."""
    if p.ci is None:
        return "cannot tell"
    if expect == "same":
        return {"equivalent": "agrees", "different, within margin": "agrees",
                "different": "disagrees"}.get(p.verdict, "cannot tell")
    if p.verdict.startswith("different"):
        return "agrees" if (p.mean > 0) == (expect == "higher") else "disagrees"
    return "disagrees" if p.verdict == "equivalent" else "cannot tell"


def check_claims(claims: list[dict], arms: dict[str, Arm], keys: list[str], margin: float) -> list[dict]:
    """Each claim of the study file against these runs: one result per arm pair it names."""
    out = []
    for c in claims:
        pairs = claim_pairs(c, arms, keys)
        if not pairs:
            out.append({**c, "A": None, "B": None, "lr": None, "paired": None, "agreement": "not run"})
        for A, B in pairs:
            lr = None
            if c["metric"] == "sensitivity":
                p = paired(A.sensitivity_per_seed(), B.sensitivity_per_seed(), margin)
            elif c["metric"] == "best_loss":  # still paired by seed: same init and batches, each at its best LR
                lr = (A.best_lr, B.best_lr) if A.best_lr is not None and B.best_lr is not None else None
                p = paired(A.per_seed(lr[0]), B.per_seed(lr[1]), margin) if lr else paired({}, {}, margin)
            else:
                picked = _at_users_lr(A, B, [(x, paired(A.per_seed(x), B.per_seed(x), margin))
                                              for x in A.lrs if x in B.lrs])
                lr, p = picked if picked else (None, paired({}, {}, margin))
            out.append({**c, "A": A.label, "B": B.label, "lr": lr, "paired": p,
                        "agreement": agreement(c["expect"], p) if p.n else "cannot tell"})
    return out


def claim_sentence(r: dict) -> str:
    """'**Xiong et al. 2020**: Post-LN ... (expects A higher than B). post - pre, v at lr 0.01: ...: **agrees**.'"""
    head = f"**{r['paper']}**: {r['says']}"
    if r["A"] is None:
        return f"{head}: **not run** (no arms of these runs match it)."
    if r["metric"] == "sensitivity":
        what = "LR sensitivity per seed"
    elif r["metric"] == "best_loss":
        what = "v at each arm's best lr" + (f" ({r['lr'][0]:g}, {r['lr'][1]:g})" if r["lr"] else "")
    else:
        what = "v" + (f" at lr {r['lr']:g}" if r["lr"] is not None else "")
    p = r["paired"]
    tail = ""
    if r["agreement"] == "cannot tell" and p.mde is not None:
        tail = f" (at n = {p.n} only a difference above {p.mde:.3f} would have been detected)"
    expect = "the same as" if r["expect"] == "same" else f"{r['expect']} than"
    return (f"{head} (expects {r['A']} {expect} {r['B']}). {r['A']} - {r['B']}, {what}: {p.describe()}: "
            f"**{r['agreement']}**{tail}.")


def study_about(paths: list[Path]) -> str:
    """The first sentence of the first study.yaml's opening comment among `paths` (what the study asks), else ''."""
    import re

    for p in paths:
        if (p / "study.yaml").is_file():
            lines = (p / "study.yaml").read_text().splitlines()
            comment = " ".join(line.lstrip("# ").strip() for line in itertools.takewhile(
                lambda line: line.startswith("#"), lines))
            return re.split(r"(?<=[.?])\s+(?=[A-Z])", comment, maxsplit=1)[0]
    return ""


def study_claims(paths: list[Path]) -> list[dict]:
    """The claims of the study files (study.yaml) among `paths`."""
    from study.grid import load_study
    from training.config import ConfigError

    claims = []
    for p in paths:
        if (p / "study.yaml").is_file():
            try:
                claims += load_study(p / "study.yaml")["claims"]
            except ConfigError as e:
                raise ValueError(str(e)) from None
    return claims


def _layer_mean(run, prefix: str, step: int) -> float | None:
    rec = next((r for r in run.records if r.get("step") == step), {})
    vals = [v for k, v in rec.items() if k.startswith(prefix) and v is not None]
    return sum(vals) / len(vals) if vals else None


def norm_input_findings(arms: dict[str, Arm], keys: list[str]) -> list[str]:
    """What the block norms receive, per arm at its best LR (mean over seeds): |per-token mean| / RMS averaged
    over layers at the first and last logged step (what LayerNorm's centring removes); and, when the arms differ in
    precision, the largest |input| seen (float16's x^2 overflows above 256) and float16's skipped steps."""
    out, ratio, absmax, skipped = [], [], [], []
    for a in arms.values():
        runs = a.at(a.best_lr) if a.best_lr is not None else []
        steps = [[r["step"] for r in run.records if "norm_in/rms/layer_0" in r] for run in runs]
        pairs = []
        for run, st in zip(runs, steps, strict=True):
            if st:
                ends = [(_layer_mean(run, "norm_in/mean/", s), _layer_mean(run, "norm_in/rms/", s)) for s in
                        (st[0], st[-1])]
                if all(m is not None and r for m, r in ends):
                    pairs.append([m / r for m, r in ends])
        if pairs:
            ratio.append(f"{a.label} {_mean([x[0] for x in pairs]):.2f} -> {_mean([x[1] for x in pairs]):.2f}")
        m = _max_series_all(a.runs, "norm_in/absmax/")
        if m is not None:
            absmax.append(f"{a.label} {m:.1f}")
        sk = [sum(r.get("amp/skipped", 0) for r in run.records) for run in a.runs if
              any("amp/skipped" in r for r in run.records)]
        if sk:
            skipped.append(f"{a.label} {sum(sk):.0f} of {sum(len(series_steps(run)) for run in a.runs)}")
    if ratio:
        dim = next(iter(arms.values())).runs[0].config.get("model.dim")
        chance = f"; {(2 / (math.pi * dim)) ** 0.5:.2f} is chance, E|mean| / RMS of zero-mean {dim}-d vectors" \
            if isinstance(dim, int) else ""
        out.append("Block norms' inputs, |per-token mean| / RMS averaged over layers, first -> last logged step (at "
                   f"each arm's best lr, mean over seeds{chance}): " + "; ".join(ratio) + ".")
    if absmax and {"train.dtype", "model.norm_precision"} & set(keys):
        out.append("Largest |norm input| over every logged step, layer and run (float16's x^2 overflows above "
                   "256): " + "; ".join(absmax) + ".")
    if skipped:
        out.append("Optimizer steps skipped by the float16 loss scaler (overflowed gradients), of all steps: "
                   + "; ".join(skipped) + ".")
    return out


def _max_series_all(runs, prefix: str) -> float | None:
    vals = [v for run in runs if (v := _max_series(run, prefix)) is not None]
    return max(vals) if vals else None


def series_steps(run) -> list[int]:
    return [r["step"] for r in run.records if "train/loss" in r]


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
             (f"Wall time: {span / 60:.1f} min with runs in flight. " if span else "")
             + f"{len(runs)} runs in {len(arms)} arms (arms differ in: {', '.join(keys) or 'nothing'}); learning rates "
             f"{', '.join(f'{x:g}' for x in lrs)}; seeds {', '.join(map(str, seeds))}; {steps} steps per run.", "",
             "Outcomes, judged on each run's own val curve: `ok` learned and kept it; `plateau` no eval got "
             "`log.plateau_margin` nats below the unigram entropy (learned token frequencies only) but still "
             "falling; `collapsed` the same and flat (its last evals fall slower than `log.flat_slope` nats per "
             "step: stuck, not slow); `unstable` "
             "learned, then ended `log.blowup_margin` above its best or above L0; `diverged` non-finite loss or "
             "gradient. "
             f"L0 is {l0_kind}. Per run the comparisons use v = min(final val loss, L0), a diverged run counting "
             "as L0. "
             "LR sensitivity (Wortsman et al. 2023) per seed = mean over the LR grid of v(lr) - min v; lower is more "
             "robust. Arms are compared paired over seeds (runs of two arms with the same seed share init and "
             "batches): mean difference with its 95% t CI, a TOST equivalence test at the margin "
             f"+-{margin:g} nats, and the minimum detectable difference at 80% power. Spike score = % of judged "
             f"steps whose value jumps above the median of the previous {any_run.get('spike_window')} by at least "
             f"k={any_run.get('spike_k')} robust std of the jumps so far (training/monitor.py: from step 7 on, "
             "so a falling curve's early spikes count; OLMo 2's 1000-step trailing mean judges none of a short "
             "run's first steps).", "",
             "| arm | best LR | v at best LR, per seed | max LR with all seeds ok | LR sensitivity, mean (95% CI) | "
             "ok / plateau / collapsed / unstable / diverged / failed | spike score loss / grad norm (%) | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for a in arms.values():
        per_seed = a.per_seed(a.best_lr) if a.best_lr else {}
        c = a.outcomes()
        m, ci = mean_ci(list(a.sensitivity_per_seed().values()))
        lines.append(f"| {a.label} | {fmt(a.best_lr, 'g')} | "
                     f"{', '.join(f'{v:.3f}' for _, v in sorted(per_seed.items(), key=lambda t: str(t[0]))) or '-'} | "
                     f"{fmt(a.max_lr_ok, 'g')} | {fmt(m)} ({_ci(ci)}) | {c['ok']} / {c['plateau']} / "
                     f"{c['collapsed']} / {c['unstable']} / {c['diverged']} / {c['failed'] + c['interrupted']} | "
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
    checked = check_claims(study_claims(paths), arms, keys, margin)
    if checked:
        lines += ["", "## What it shows", "",
                  "Each claim of the literature named in the study file, checked against these runs by the paired "
                  "verdict alone: `agrees` / `disagrees` need a CI that excludes 0 (a difference) or a TOST pass "
                  "(sameness); anything else is `cannot tell`, with the difference this n could have detected.", ""]
        lines += [f"- {claim_sentence(r)}" for r in checked]
    lines += ["", "## What the numbers show", ""] + [f"- {s}" for s in findings(arms, keys, margin)
                                                     + norm_input_findings(arms, keys)]
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
        for index in sorted(p.glob("sweep*.json")):  # sweep.json, or one per shard of a job array
            failed = [e for e in json.loads(index.read_text())["runs"] if e.get("status") == "failed"]
            for e in failed:
                lines.append(f"| {e['name']} | failed (exit {e['exit_code']}): {e.get('error', '')} | | | | | |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps({
        "name": ", ".join(p.name for p in paths), "about": study_about(paths), "runs": len(runs),
        "arms": len(arms), "arm_keys": keys, "steps": steps, "wall_min": round(span / 60, 1) if span else None,
        "claims": [{k: r[k] for k in ("paper", "says", "metric", "expect", "A", "B", "lr", "agreement")}
                   | _paired_json(r["paired"]) for r in checked]}, indent=1) + "\n")
    return path


def _paired_json(p: Paired | None) -> dict:
    if p is None:
        return {}
    return {"n": p.n, "mean": p.mean, "ci": list(p.ci) if p.ci else None, "verdict": p.verdict, "mde": p.mde}

