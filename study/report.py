"""report.md, report.json and the figures of a study: study/result.py computes, this file only renders."""

from __future__ import annotations

import json
from pathlib import Path

from study.compare import claim_sentence
from study.figures import figures
from study.findings import findings, margin_sentence
from study.result import StudyResult, compute
from study.text import fmt, interval

PROTOCOL = ("Outcomes, judged on each run's own curves: `ok` learned and kept it; `plateau` no eval got "
            "`log.plateau_margin` nats below the unigram entropy (learned token frequencies only) but still falling; "
            "`collapsed` the same and stuck (at its last evals' slope it would not get that far below within "
            "`log.flat_horizon` x its steps again); "
            "`unstable` learned, then ended `log.blowup_margin` above its best or above L0; `diverged` non-finite "
            "loss or gradient. `collapsed`, `unstable` and `diverged` are failures: they enter the failure curve and "
            "never a loss average; `ok` and `plateau` runs trained and their final val loss is compared. "
            "Stability: per arm P(fail | lr) is a logistic curve in log10 lr fitted with Firth's penalty, LR50 the LR "
            "where it crosses 1/2, with a 95% profile-likelihood CI; two arms are compared by LR50_A / LR50_B from "
            "both arms' runs fitted with one slope (likelihood-ratio p). Loss: each arm's best LR is chosen on the "
            "selection seeds (lowest mean final val loss among LRs where every selection seed trained) and compared "
            "on the test seeds, paired by seed (same init and batches), over the seeds where both runs trained: "
            "mean difference with its 95% t CI, TOST at the margin, the minimum detectable difference at 80% power "
            "(noncentral t). The claims' primary tests are Holm-adjusted within the study. Spike score = % of "
            "judged steps whose value jumps above the median of the previous `log.spike_window` by at least "
            "`log.spike_k` robust std of the jumps so far (training/monitor.py).")


def _seed_values(values: dict) -> str:
    return ", ".join(f"{v:.3f}" for _, v in sorted(values.items(), key=lambda t: str(t[0]))) or "-"


def render(res: StudyResult, made: list[tuple[str, str]]) -> str:
    runs, arms = res.runs, res.arms
    lrs = sorted({r.lr for r in runs})
    steps = runs[0].config.get("train.steps")
    how = "the study's protocol" if res.file.protocol else "the lowest 40% of the seeds (these runs had no protocol)"
    lines = [f"# Stability report: {res.file.name}", "",
             (f"Wall time: {res.wall_s / 60:.1f} min with runs in flight. " if res.wall_s else "")
             + f"{len(runs)} runs in {len(arms)} arms (arms differ in: {', '.join(res.keys) or 'nothing'}); learning "
             f"rates {', '.join(f'{x:g}' for x in lrs)}{f'; {steps} steps per run' if steps else ''}. Selection seeds "
             f"{', '.join(map(str, res.selection_seeds)) or 'none'} and test seeds "
             f"{', '.join(map(str, res.test_seeds)) or 'none'} ({how}).", "", PROTOCOL, "",
             "| arm | best LR (selection seeds) | final val loss there: selection / test seeds | LR50 (95% CI) | "
             "max LR with all seeds ok | ok / plateau / collapsed / unstable / diverged / crashed | "
             "spike score loss / grad norm (%) | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for label, a in arms.items():
        fit, c = res.failures[label], a.outcomes()
        sel = a.losses(a.best_lr, res.selection_seeds) if a.best_lr else {}
        test = a.losses(a.best_lr, res.test_seeds) if a.best_lr else {}
        beyond = f"; above the largest LR tried, {fit.top:g}: extrapolated" if fit.lr50 and fit.lr50 > fit.top else ""
        lr50 = f"{fmt(fit.lr50, '.3g')} ({interval(fit.ci)}{beyond})" if fit.lr50 else (
            f"> {fit.top:g} (none failed)" if fit.failed == 0 and fit.top else "-")
        lines.append(f"| {label} | {fmt(a.best_lr, 'g')} | {_seed_values(sel)} / {_seed_values(test)} | {lr50} | "
                     f"{fmt(a.max_lr_ok, 'g')} | {c['ok']} / {c['plateau']} / {c['collapsed']} / {c['unstable']} / "
                     f"{c['diverged']} / {c['failed'] + c['interrupted']} | "
                     f"{fmt(a.summary_mean('spike_score/loss'), '.2f')} / "
                     f"{fmt(a.summary_mean('spike_score/grad_norm'), '.2f')} | {fmt(a.tokens_per_s(), ',.0f')} |")
    if res.comparisons:
        lines += ["", "## Arms compared", "",
                  "Pairs of arms that differ in one field. Stability: LR50_A / LR50_B (one slope, 95% profile CI; "
                  "`open`: the data bound it on one side only). Loss: A - B at each one's best LR on the test seeds "
                  "where both trained (nested, paired).", "",
                  "| A | B | differ in | LR50 A / B | 95% CI | p | A - B (nats) | 95% CI | n | verdict | TOST p | "
                  "MDE | left out |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in res.comparisons:
            r, p = c.ratio, c.loss.paired
            lines.append(f"| {c.a.label} | {c.b.label} | {c.key} | {fmt(r.ratio, '.3g')} | {interval(r.ci)} | "
                         f"{fmt(r.p, '.2g')} | {fmt(p.mean, '+.3f')} | {interval(p.ci, '+.3f')} | {p.n} | "
                         f"{p.verdict} | "
                         f"{fmt(p.p_tost, '.3g')} | {fmt(p.mde)} | {'; '.join(c.loss.dropped) or '-'} |")
        lines += ["", margin_sentence(res)]
    if res.claims or res.file.withdrawn:
        lines += ["", "## What it shows", "",
                  "Each claim of the literature named in the study file, decided by its primary test alone, "
                  f"Holm-adjusted over the {sum(c.p is not None for c in res.claims)} tests of this study: `agrees` / "
                  "`disagrees` need an adjusted p < 0.05 (a `same` claim disagrees when its CI lies outside the "
                  "margin); anything else is `cannot tell`.", ""]
        lines += [f"- {claim_sentence(c, res.margin)}" for c in res.claims]
    if res.file.withdrawn:
        lines += ["", "Claims withdrawn: what these runs cannot test as the paper states it.", ""]
        lines += [f"- **{w['paper']}**: {w['says']}: **withdrawn**: {w['why']}" for w in res.file.withdrawn]
    if res.trends:
        lines += ["", "## Trends", "",
                  "Each comparison along a numeric axis of the arms: the estimate and its 95% CI at each value, and a "
                  "random-effects weighted fit of them (DerSimonian-Laird: points scattered beyond their CIs "
                  "weigh alike) with the slope's 95% CI (study/trend.py); nothing beyond the values measured.", ""] \
            + [f"- {t.describe()}." for t in res.trends]
    lines += ["", "## What the numbers show", ""] + [f"- {s}" for s in findings(res)]
    if res.per_lr:
        lines += ["", "## Per-LR paired differences (exploratory)", "",
                  "Every LR both arms ran, over every seed where both runs trained; not corrected for multiplicity "
                  "and not nested (the LRs were chosen on these seeds): for orientation only.", "",
                  "| A | B | differ in | lr | n | A - B | 95% CI | verdict | p |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for a, b, key, lr, p in res.per_lr:
            lines.append(f"| {a.label} | {b.label} | {key} | {lr:g} | {p.n} | {fmt(p.mean, '+.3f')} | "
                         f"{interval(p.ci, '+.3f')} | "
                         f"{p.verdict} | {fmt(p.p_diff, '.3g')} |")
    lines += ["", "## Figures", ""]
    for fname, caption in made:
        lines += [f"**{caption}**", "", f"![{caption}]({fname})", ""]
    lines += ["## Runs", "", "| run | status | final val loss | best val loss | diverged at | L0 | tokens/s |",
              "|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: r.name):
        s = r.summary
        lines.append(f"| {r.name} | {r.status} | {fmt(s.get('final_val_loss'))} | {fmt(s.get('best_val_loss'))} | "
                     f"{fmt(s.get('diverged_at'), 'd')} | {fmt(r.init_loss)} | {fmt(s.get('tokens_per_s'), ',.0f')} |")
    return "\n".join(lines) + "\n"


def failed_entries(paths: list[Path]) -> list[str]:
    """Runs that crashed (sweep*.json: failed, with the error), as table rows."""
    rows = []
    for p in paths:
        for index in sorted(p.glob("sweep*.json")):  # sweep.json, or one per shard of a job array
            for e in json.loads(index.read_text())["runs"]:
                if e.get("status") == "failed":
                    rows.append(f"| {e['name']} | failed (exit {e['exit_code']}): {e.get('error', '')} | | | | | |")
    return rows


def as_json(res: StudyResult) -> dict:
    """report.json: what readme_results.py and the index read."""
    def pj(p):
        return {"n": p.n, "mean": p.mean, "ci": list(p.ci) if p.ci else None, "verdict": p.verdict, "mde": p.mde,
                "p": p.p_diff, "p_tost": p.p_tost}

    def rj(r):
        return {"ratio": r.ratio, "ci": list(r.ci) if r.ci else None, "p": r.p, "n": r.n, "failed": r.failed}

    return {
        "name": res.file.name, "about": res.file.about, "runs": len(res.runs), "arms": len(res.arms),
        "arm_keys": res.keys, "steps": res.runs[0].config.get("train.steps"),
        "wall_min": round(res.wall_s / 60, 1) if res.wall_s else None, "margin": res.margin,
        "selection_seeds": res.selection_seeds, "test_seeds": res.test_seeds,
        "per_arm": {label: {"config": {k: a.runs[0].config.get(k) for k in res.keys}, "best_lr": a.best_lr,
                            "lr50": res.failures[label].lr50,
                            "lr50_ci": list(res.failures[label].ci) if res.failures[label].ci else None,
                            "failed": res.failures[label].failed, "finished": res.failures[label].n,
                            "top_lr": res.failures[label].top, "max_lr_ok": a.max_lr_ok}
                    for label, a in res.arms.items()},
        "comparisons": [{"A": c.a.label, "B": c.b.label, "key": c.key, "lr50_ratio": rj(c.ratio),
                         "lrs": list(c.loss.lrs) if c.loss.lrs else None, "loss": pj(c.loss.paired),
                         "dropped": c.loss.dropped, "tost_needs": c.loss.needed} for c in res.comparisons],
        "claims": [{**{k: c.claim[k] for k in ("paper", "says", "metric", "expect")}, "A": c.a, "B": c.b,
                    "estimate": c.estimate, "p": c.p, "p_holm": c.p_holm, "agreement": c.agreement,
                    **({"lr50_ratio": rj(c.ratio)} if c.ratio else {}),
                    **({"lrs": list(c.nested.lrs) if c.nested.lrs else None, "loss": pj(c.nested.paired)}
                       if c.nested else {})} for c in res.claims],
        "withdrawn": res.file.withdrawn,
        "trends": [{"what": t.what, "pair": t.pair, "axis": t.axis, "per_doubling": t.log2,
                    "points": [[x, e, list(ci) if ci else None] for x, e, ci in t.points], "slope": t.slope,
                    "ci": list(t.ci) if t.ci else None, "used": t.used} for t in res.trends]}


def write_report(paths: list[Path], out: Path, margin: float | None = None) -> Path:
    """report.md, report.json and the figures in `out`, from the runs under `paths`; ValueError when there are
    none. The equivalence margin: `margin`, else the study file's `equivalence_margin`, else 0.02 nats."""
    res = compute(paths, margin)
    out.mkdir(parents=True, exist_ok=True)
    made = figures(res, out)
    text = render(res, made)
    rows = failed_entries(paths)
    path = out / "report.md"
    path.write_text(text.rstrip("\n") + ("\n" + "\n".join(rows) if rows else "") + "\n")
    (out / "report.json").write_text(json.dumps(as_json(res), indent=1) + "\n")
    (out / "runs.json").write_text(json.dumps(runs_json(res)) + "\n")
    return path


KEPT = ("optim.lr", "train.seed", "train.steps", "log.plateau_margin", "log.blowup_margin", "log.flat_horizon")
SUMMARY = ("status", "final_val_loss", "best_val_loss", "unigram_entropy", "diverged_at", "tokens_per_s")


def runs_json(res: StudyResult) -> list[dict]:
    """Every run as the report read it, small enough to commit: the arm's fields, LR, seed and outcome thresholds,
    the summary's outcome numbers and the val curve, so a later protocol can judge and decide again
    (study/archive.py) without the run directories."""
    return [{"name": r.name, "config": {k: r.config.get(k) for k in (*res.keys, *KEPT)},
             "summary": {k: r.summary.get(k) for k in SUMMARY},
             "val": [[e["step"], e["val/loss"]] for e in r.records if e.get("val/loss") is not None]}
            for r in sorted(res.runs, key=lambda r: r.name)]
