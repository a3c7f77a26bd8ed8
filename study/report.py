"""report.md, report.json and the figures of a study: study/result.py computes, this file only
renders."""

from __future__ import annotations

import json
from pathlib import Path

from study.arms import mean_of
from study.claims import claim_sentence
from study.figures import figures
from study.findings import findings, margin_sentence
from study.history import history
from study.lr50 import bound_text
from study.precursors import table as precursor_table
from study.protocol import adaptive_outcome, round_runs
from study.read import KINDS, last_half
from study.result import StudyResult, compute
from study.text import BUDGET, bare, fmt, g, interval


def budgets(path: Path | None) -> list[dict]:
    """Each distinct budget of the study's arms, shortest first: steps, tokens, and tokens per
    parameter, all parameters and non-embedding ones (Kaplan et al. 2020's N), with the ranges of
    both counts over the arms; [] without a file."""
    if path is None:
        return []
    import torch

    from model import Llama
    from study.studyfile import arm_configs, load_study

    seen: dict = {}
    for cfg in arm_configs(load_study(path)):
        with torch.device("meta"):
            model = Llama(cfg.model)
        t = cfg.train
        tokens = t.steps * t.batch_size * t.seq_len
        total, blocks = model.num_params(), model.num_params(non_embedding=True)
        b = seen.setdefault(
            (tokens, f"{tokens / total:.2g}", f"{tokens / blocks:.2g}"),
            {"steps": t.steps, "batch": [t.batch_size, t.seq_len], "tokens": tokens},
        )
        b.setdefault("total", set()).add(total)
        b.setdefault("blocks", set()).add(blocks)
    out = []
    for (_tokens, per, per_block), b in sorted(seen.items()):
        out.append(
            {
                **{k: b[k] for k in ("steps", "batch", "tokens")},
                "parameters": [min(b["total"]), max(b["total"])],
                "non_embedding_parameters": [min(b["blocks"]), max(b["blocks"])],
                "per_parameter": per,
                "per_non_embedding": per_block,
            }
        )
    return out


def budget_text(path: Path | None) -> str:
    """The study's budget per run in tokens per parameter, all parameters and non-embedding ones
    (Kaplan et al. 2020's N), one phrase per distinct budget of its arms; '' without a file."""
    found = budgets(path)
    if not found:
        return ""

    def n(values: list) -> str:
        return "-".join(f"{v:,}" for v in sorted(set(values)))

    return (
        "Budget per run: "
        + "; ".join(
            f"{b['tokens'] / 1e6:.3g}M tokens ({b['steps']} steps of {b['batch'][0]} x "
            f"{b['batch'][1]}) = {b['per_parameter']} tokens per parameter ({n(b['parameters'])}), "
            f"{b['per_non_embedding']} per non-embedding parameter "
            f"({n(b['non_embedding_parameters'])})"
            for b in found
        )
        + "."
    )


def protocol_text(res: StudyResult) -> str:
    """How this report judged and compared, in one paragraph (METHODS.md has the whole)."""
    f = res.file
    how = (
        "Failure, fixed in the study file before the runs and applied alike to every run: "
        f"{f.rule.describe()}. "
        if f.given
        else f"No study file was given: a run failed if it had {f.rule.describe()}. "
    )
    labels = (
        "train.py's own labels (ok, plateau, collapsed, unstable, diverged) describe single runs "
        "and decide "
        "nothing here. "
        if f.given
        else ""
    )
    return (
        how
        + "A run that failed is an outcome, never a loss; "
        + labels
        + "Stability: per arm, P(fail | lr) from the "
        "lowest LR where every selection seed trained up (a failure below it was too slow, not "
        "unstable), a "
        "logistic curve in log10 lr fitted with Firth's penalty; LR50 is a number where some LR "
        "has both failed "
        "and trained runs and >= 2 runs failed, else the bracket its runs give (complete "
        "separation: the fit's "
        "number is the penalty's, not the data's); two arms' LR50 ratio is fitted with one slope "
        "(likelihood-"
        "ratio p), and where an arm is only bracketed a `same` claim is decided on the brackets. "
        "Each failed run "
        "has a kind read from its curve (collapsed, blew up, non-finite, slow, stalled); LR50 is "
        "given again for "
        "instability alone (collapsed, blew up, non-finite; slow runs censored). LR sensitivity "
        "(Wortsman et al. "
        "2023): the mean over the study's LR grid of min(L, L0) - L*, L* the arm's own best mean "
        "final loss, per "
        "seed, 95% t CI below 8 seeds (the per-size L*, the best of any arm of the same size, "
        "beside it). Loss: "
        "each arm's best LR chosen on the selection seeds and "
        "compared on the test seeds, and both arms at a common safe LR on the common seeds, paired "
        "by seed over "
        "the seeds where both trained (95% t CI, TOST at the margin, minimum detectable "
        "difference). The claims "
        "are the study file's, each decided by one primary test, Holm-adjusted over all of them; "
        "every other "
        "table is exploratory."
    )


def _seed_values(values: dict) -> str:
    return ", ".join(f"{v:.3f}" for _, v in sorted(values.items(), key=lambda t: str(t[0]))) or "-"


def lr50_cell(fit) -> str:
    """An arm's LR50 as a table states it: the number and CI where identified, else the bound."""
    if fit.identified:
        return f"{fmt(fit.lr50, '.3g')} ({interval(fit.ci)})"
    return fit.bracket() + f" ({fit.failed}/{fit.n} in all)"


def ratio_cells(r) -> tuple[str, str]:
    """(LR50 ratio, its 95% CI) for a table: numbers only where both LR50s are identified, else
    the ratios the arms' brackets allow and no interval."""
    if r.identified:
        return fmt(r.ratio, ".3g"), interval(r.ci)
    return f"{bound_text(*r.bounds)} (brackets)", "-"


def budgets_text(runs) -> str:
    """Every budget of the runs, in steps: '300' or, along a steps axis, '300/1000/3000'."""
    return "/".join(
        str(s) for s in sorted({int(r.config[BUDGET]) for r in runs if r.config.get(BUDGET)})
    )


def by_budget(res: StudyResult) -> list[str]:
    """Where the arms differ in their budget: each claim's verdict at each budget side by side, and
    whether it holds at every budget or changes (small-scale verdicts can flip with the budget)."""
    if BUDGET not in res.keys:
        return []
    tested = [c for c in res.claims if c.a is not None]

    def steps(label: str) -> int:
        return int(res.arms[label].runs[0].config[BUDGET])

    pending = {int(b) for b in res.running if b is not None}  # a budget not begun has no arms
    budgets = sorted({steps(c.a) for c in tested} | pending)
    rows: dict[tuple, dict] = {}
    for c in tested:
        if steps(c.a) == steps(c.b):
            rows.setdefault((c.claim["says"], bare(c.a), bare(c.b)), {})[steps(c.a)] = c
    if not rows:
        return []
    out = [
        "## Verdicts by budget",
        "",
        "| claim | A vs B | " + " | ".join(f"{s} steps" for s in budgets) + " | at every budget |",
        "|---|---|" + "---|" * len(budgets) + "---|",
    ]
    for (says, a, b), at in rows.items():
        verdicts = [
            at[s].agreement if s in at else ("running" if s in pending else "not run")
            for s in budgets
        ]
        same = len(set(verdicts)) == 1 and len(at) == len(budgets)
        whole = (
            "not known yet (stages running)"
            if "running" in verdicts
            else f"holds: {verdicts[0]}"
            if same
            else "changes with the budget"
        )
        out.append(
            f"| {says} | {a} vs {b} | "
            + " | ".join(
                f"**{v}**, Holm p {fmt(at[s].p_holm, '.2g')}" if s in at and v != "running" else v
                for s, v in zip(budgets, verdicts, strict=True)
            )
            + f" | {whole} |"
        )
    return [*out, ""]


def adaptive_stage(res: StudyResult) -> list[str]:
    """Per LR50 claim, how the adaptive edge stage ended (decided at which look, its maximum spent)
    and the runs its rounds made, beside the verdict it reached."""
    p = res.file.protocol
    if p is None or p.adaptive is None:
        return []
    rows = []
    for c in res.claims:
        if c.a is None or c.claim["metric"] != "lr50" or c.agreement == "running":
            continue
        ended, used = adaptive_outcome(
            res.arms[c.a].runs,
            res.arms[c.b].runs,
            c.claim["expect"],
            p,
            res.file.ratio_margin,
            len(res.claims),
        )
        spent = round_runs(res.arms[c.a].runs, res.arms[c.b].runs, p.adaptive)
        rows.append(
            f"| {c.claim['says']} | {c.a} vs {c.b} | {ended} | {used} | {spent} | "
            f"**{c.agreement}**, Holm p {fmt(c.p_holm, '.2g')} |"
        )
    a = p.adaptive
    return [
        "## The adaptive edge stage",
        "",
        f"Rounds of {a.seeds_per_round} new seeds at {a.lrs} LRs x{a.step:.3g} apart around each "
        f"arm's LR50 estimate, at most {a.max_runs} runs a claim ({a.rounds} rounds, {a.looks} "
        f"looks); a claim stops at the first look where looks x p < {a.alpha:g} / "
        f"{len(res.claims)} (the Holm family). Its runs: those of the rounds up to where it "
        "stops, at its two arms; at its arms: every round's runs there (an arm shared by two "
        "claims serves both; a rule changed after the runs can stop a claim earlier than the "
        "sweep did).",
        "",
        "| claim | A vs B | the stage | its runs | at its arms | verdict |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def convergence(res: StudyResult) -> list[str]:
    """At each arm's best LR, the runs' end-of-run slope: have the curves flattened when the budget
    ends? (Norms compared on runs still falling compare speed, not where they converge.)"""
    rows = []
    for label, arm in res.arms.items():
        if arm.best_lr is None:
            continue
        done = [r for r in arm.at(arm.best_lr) if r.trained]
        slopes = [b for b in (last_half(r)[1] for r in done) if b is not None]
        if not slopes:
            continue
        flat = res.file.rule.slow_slope
        mean = sum(slopes) / len(slopes)
        rows.append(
            f"| {label} | {g(arm.best_lr)} | {fmt(mean_of([r.final for r in done]))} | "
            f"{mean:+.3f} ({min(slopes):+.3f}..{max(slopes):+.3f}), n = {len(slopes)} | "
            f"{'flat' if abs(mean) <= flat else 'still falling' if mean < 0 else 'rising'} |"
        )
    if not rows:
        return []
    return [
        "## Convergence at each arm's best LR",
        "",
        "The slope of the last half of each run's evals, in nats per 10% of its budget (flat: "
        f"within {res.file.rule.slow_slope:g}, the study's `slow_slope`).",
        "",
        "| arm | best LR | final val loss | end-of-run slope: mean (min..max) | curve |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def interim(res: StudyResult) -> list[str]:
    """Where the protocol's stages have not all run: which, at which budgets, and what that means
    for the claims there."""
    if not res.running:
        return []
    where = "; ".join(
        f"{'' if b is None else f'at {b:g} steps, '}from the {stage} stage on"
        for b, stage in sorted(res.running.items(), key=lambda x: (x[0] is not None, x[0] or 0))
    )
    return [
        f"**Interim report**: the protocol's stages have not all run ({where}); the sweep resumes "
        "them. The claims there are `running`: not decided, in the Holm family with p = 1 (the "
        "others' Holm p can only fall when they are decided). Runs in flight or interrupted (no "
        "outcome in sweep.json yet) are not read.",
        "",
    ]


def glance(res: StudyResult, made: list[tuple[str, str]]) -> list[str]:
    """The report's first screen: each claim's verdict and number in one table, then the stability
    map."""
    out = []
    tested = [c for c in res.claims if c.a is not None]
    if tested:
        out += [
            "## Claims at a glance",
            "",
            "| claim | A vs B | metric | verdict | estimate | Holm p |",
            "|---|---|---|---|---|---|",
        ]
        for c in tested:
            if c.agreement == "running":
                est = "-"
            elif c.ratio is not None:
                ratio, ci = ratio_cells(c.ratio)
                est = f"ratio {ratio}" + (f" ({ci})" if c.ratio.identified else "")
            else:
                p = c.nested.paired
                est = (
                    "-"
                    if p.mean is None
                    else f"{p.mean:+.3f} ({interval(p.ci, '+.3f')}), n = {p.n}"
                )
            out.append(
                f"| {c.claim['says']} | {c.a} vs {c.b} | {c.claim['metric']} | **{c.agreement}** | "
                f"{est} | "
                f"{fmt(c.p_holm, '.2g')} |"
            )
        out.append("")
    out += by_budget(res)
    if any(f == "stability_map.png" for f, _ in made):
        out += [
            "![stability map: every run's outcome by LR and each arm's failure "
            "curve](stability_map.png)",
            "",
        ]
    return out


def render(res: StudyResult, made: list[tuple[str, str]]) -> str:
    runs, arms = res.runs, res.arms
    lrs = sorted({r.lr for r in runs})
    steps = budgets_text(runs)
    how = (
        "the study's protocol"
        if res.file.protocol
        else "the lowest 40% of the seeds (these runs had no protocol)"
    )
    common = f", common seeds {', '.join(map(str, res.common_seeds))}" if res.common_seeds else ""
    lines = [
        f"# Stability report: {res.file.name}",
        "",
        *([res.file.about, ""] if res.file.about else []),
        (f"Wall time: {res.wall_s / 60:.1f} min with runs in flight. " if res.wall_s else "")
        + f"{len(runs)} runs in {len(arms)} arms "
        f"(arms differ in: {', '.join(res.keys) or 'nothing'}); learning "
        f"rates {', '.join(f'{x:g}' for x in lrs)}{f'; {steps} steps per run' if steps else ''}. "
        "Selection seeds "
        f"{', '.join(map(str, res.selection_seeds)) or 'none'} and test seeds "
        f"{', '.join(map(str, res.test_seeds)) or 'none'}{common} ({how}).",
        "",
        *([budget_text(res.file.path), ""] if res.file.path else []),
        *interim(res),
        *glance(res, made),
        *convergence(res),
        *adaptive_stage(res),
        protocol_text(res),
        "",
    ]
    past = history(res.file.name, res.file.history)
    if past:
        lines += (
            [
                "## History of the study file",
                "",
                "The study file was changed after results of it (or of a pilot) were committed; "
                "the runs above are "
                "judged by the file as it is now:",
                "",
            ]
            + [f"- {h}" for h in past]
            + [""]
        )
    if res.claims or res.file.withdrawn:
        lines += [
            "## Claims (pre-registered)",
            "",
            "The study file's claims, each decided by its primary test alone, Holm-adjusted over "
            "the family of "
            f"all {len(res.claims)} (a claim its runs cannot test is in it with p = 1): `agrees` / "
            "`disagrees` "
            "need an adjusted p < 0.05; anything else is `cannot tell`.",
            "",
        ]
        lines += [f"- {claim_sentence(c)}" for c in res.claims]
    if res.file.withdrawn:
        lines += ["", "Claims withdrawn: what these runs cannot test as the paper states it.", ""]
        lines += [
            f"- **{w['paper']}**: {w['says']}: **withdrawn**: {w['why']}"
            for w in res.file.withdrawn
        ]
    alt = list(res.alternatives)
    lines += [
        "",
        "## Arms",
        "",
        "| arm | best LR (selection seeds) | final val loss there: selection / test seeds | LR50 "
        "(main rule) | "
        "LR50 (instability alone) | "
        + "".join(f"LR50 ({name}) | " for name in alt)
        + "LR sensitivity (nats, 95% CI) | failed below the floor (too slow) | "
        "train.py labels ok / plateau / collapsed / unstable / diverged / crashed | "
        "spike score loss / grad norm (%) | tokens/s |",
        "|---|---|---|---|---|" + "---|" * len(alt) + "---|---|---|---|---|",
    ]
    for label, a in arms.items():
        fit, c = res.failures[label], a.outcomes()
        sel = a.losses(a.best_lr, res.selection_seeds) if a.best_lr else {}
        test = a.losses(a.best_lr, res.test_seeds) if a.best_lr else {}
        sens = res.sensitivity.get(label)
        size = res.sensitivity_size.get(label)
        sens_text = (
            "-"
            if sens is None or sens.mean is None
            else (
                f"{sens.mean:.3f}"
                + (f" ({sens.ci[0]:.3f}..{sens.ci[1]:.3f})" if sens.ci else "")
                + f", n = "
                f"{len(sens.per_seed)}"
                + ("" if sens.bracketed else f", best LR {sens.best_lr:g}: not bracketed")
                + (
                    f"; per-size L*: {size.mean:.3f}"
                    if size is not None
                    and size.mean is not None
                    and abs(size.mean - sens.mean) > 5e-4
                    else ""
                )
            )
        )
        unstable = res.instability.get(label)
        lines.append(
            f"| {label} | {fmt(a.best_lr, 'g')} | {_seed_values(sel)} / {_seed_values(test)} | "
            f"{lr50_cell(fit)} | {lr50_cell(unstable) if unstable else '-'} | "
            + "".join(f"{lr50_cell(res.alternatives[n][label])} | " for n in alt)
            + f"{sens_text} | {len(a.slow())} | {c['ok']} / {c['plateau']} / {c['collapsed']} / "
            f"{c['unstable']} / {c['diverged']} / {c['failed'] + c['interrupted']} | "
            f"{fmt(a.summary_mean('spike_score/loss'), '.2f')} / "
            f"{fmt(a.summary_mean('spike_score/grad_norm'), '.2f')} | "
            f"{fmt(a.tokens_per_s(), ',.0f')} |"
        )
    if alt:
        lines += [
            "",
            "Alternative failure rules (the study file's; the same runs judged again): "
            + "; ".join(f"{r.name}: {r.describe()}" for r in res.file.alternatives)
            + ".",
            rule_sensitivity(res),
        ]
    lines += kinds_table(res)
    lines += precursor_table(
        {
            label: [
                (
                    r.records,
                    int(r.config.get("log.spike_window", 5)),
                    float(r.config.get("log.spike_k", 5.0)),
                )
                for r in arm.runs
            ]
            for label, arm in res.arms.items()
        }
    )
    if res.comparisons:
        lines += [
            "",
            "## Arms compared (exploratory)",
            "",
            "Pairs of arms that differ in one field, every such pair: not the study's claims, not "
            "corrected for "
            "multiplicity. Stability: LR50_A / LR50_B (one slope, 95% profile CI; "
            "`open`: the data bound it on one side only; where an arm's LR50 is only bracketed, "
            "the ratios its brackets allow). Loss: A - B at each one's best LR on the "
            "test seeds "
            "where both trained (nested, paired).",
            "",
            "| A | B | differ in | LR50 A / B | 95% CI | p | A - B (nats) | 95% CI | n | verdict | "
            "TOST p | "
            "MDE | left out |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in res.comparisons:
            r, p = c.ratio, c.loss.paired
            lines.append(
                f"| {c.a.label} | {c.b.label} | {c.key} | {' | '.join(ratio_cells(r))} "
                "| "
                f"{fmt(r.p, '.2g')} | {fmt(p.mean, '+.3f')} | {interval(p.ci, '+.3f')} | {p.n} | "
                f"{p.verdict} | "
                f"{fmt(p.p_tost, '.3g')} | {fmt(p.mde)} | {'; '.join(c.loss.dropped) or '-'} |"
            )
        lines += ["", margin_sentence(res)]
    if res.trends:
        lines += [
            "",
            "## Trends (exploratory)",
            "",
            "Each comparison along a numeric axis of the arms, and each arm's LR sensitivity along "
            "it (mean "
            "over seeds, 95% t CI): the estimate and its 95% CI at each value, and a "
            "random-effects weighted "
            "fit of them (DerSimonian-Laird) with the slope's Knapp-Hartung 95% CI "
            "(study/trend.py); nothing "
            "beyond the values measured.",
            "",
        ] + [f"- {t.describe()}." for t in res.trends]
    lines += ["", "## What the numbers show (exploratory)", ""] + [f"- {s}" for s in findings(res)]
    if res.per_lr:
        lines += [
            "",
            "## Per-LR paired differences (exploratory)",
            "",
            "Every LR both arms ran, over every seed where both runs trained; not corrected for "
            "multiplicity "
            "and not nested (the LRs were chosen on these seeds): for orientation only.",
            "",
            "| A | B | differ in | lr | n | A - B | 95% CI | verdict | p |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for a, b, key, lr, p in res.per_lr:
            lines.append(
                f"| {a.label} | {b.label} | {key} | {lr:g} | {p.n} | {fmt(p.mean, '+.3f')} | "
                f"{interval(p.ci, '+.3f')} | "
                f"{p.verdict} | {fmt(p.p_diff, '.3g')} |"
            )
    lines += ["", "## Figures", ""]
    for fname, caption in made:
        lines += [f"**{caption}**", "", f"![{caption}]({fname})", ""]
    lines += [
        "## Runs",
        "",
        "| run | status | final val loss | best val loss | diverged at | L0 | tokens/s | study "
        "rule |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: r.name):
        s = r.summary
        verdict = "-" if not r.finished else ("trained" if r.trained else f"failed: {r.why}")
        lines.append(
            f"| {r.name} | {r.status} | {fmt(s.get('final_val_loss'))} | "
            f"{fmt(s.get('best_val_loss'))} | "
            f"{fmt(s.get('diverged_at'), 'd')} | {fmt(r.init_loss)} | "
            f"{fmt(s.get('tokens_per_s'), ',.0f')} | "
            f"{verdict} |"
        )
    return "\n".join(lines) + "\n"


def kinds_table(res: StudyResult) -> list[str]:
    """Failures by kind, per arm and LR (docs/METHODS.md, "Failure kinds"); nothing where no run
    failed."""
    rows = [
        (label, lr, row)
        for label, a in res.arms.items()
        for lr, row in a.kinds().items()
        if row["trained"] < row["runs"]
    ]
    if not rows:
        return []
    kinds = [k for k in KINDS if any(row[k] for _, _, row in rows)]
    out = [
        "",
        "## Failures by kind",
        "",
        "Each failed run's kind, read from its eval curve by the study file's thresholds: "
        "collapsed (the last "
        "half at or above the unigram entropy minus the learn margin), blew up, non-finite, slow "
        "(still falling "
        f"faster than {res.file.rule.slow_slope:g} nats per 10% of the budget and below the "
        "unigram entropy: a "
        "run still learning when the budget ended, censored for instability), stalled (flat below "
        "the unigram "
        "level, failed a relative rule). LRs where every run trained are left out.",
        "",
        "| arm | lr | runs | trained | " + " | ".join(kinds) + " |",
        "|---|---|---|---|" + "---|" * len(kinds),
    ]
    out += [
        f"| {label} | {lr:g} | {row['runs']} | {row['trained']} | "
        + " | ".join(str(row[k]) for k in kinds)
        + " |"
        for label, lr, row in rows
    ]
    return out


def rule_sensitivity(res: StudyResult) -> str:
    """Whether a verdict would change with the rule: for each arm whose LR50 is identified under one
    rule and not under another, or whose identified LR50s differ by more than their CIs allow, say
    so."""

    def differ(a, b) -> bool:
        if a.identified != b.identified:
            return True
        if a.identified:
            return max(a.lr50, b.lr50) / min(a.lr50, b.lr50) > 1.25
        return a.bounds != b.bounds

    moved = []
    for label, fit in res.failures.items():
        others = [
            fits[label] for fits in (*res.alternatives.values(), res.instability) if label in fits
        ]
        if any(differ(fit, o) for o in others):
            moved.append(f"{label} ({'; '.join(lr50_cell(f) for f in [fit, *others])})")
    if not moved:
        return "Every arm's LR50 reads the same under every rule."
    return (
        "LR50 depends on the rule for: "
        + ", ".join(moved)
        + " (main; then the alternatives, in the order above; "
        "then instability alone)."
        " A verdict resting on these arms' LR50s depends on the rule."
    )


def failed_entries(paths: list[Path]) -> list[str]:
    """Runs that crashed (sweep*.json: failed, with the error), as table rows."""
    rows = []
    for p in paths:
        for index in sorted(p.glob("sweep*.json")):  # sweep.json, or one per shard of a job array
            for e in json.loads(index.read_text())["runs"]:
                if e.get("status") == "failed":
                    rows.append(
                        f"| {e['name']} | failed (exit {e['exit_code']}): {e.get('error', '')} | | "
                        "| | | |"
                    )
    return rows


def fit_json(f) -> dict:
    return {
        "lr50": f.lr50 if f.identified else None,
        "ci": list(f.ci) if f.identified and f.ci else None,
        # Firth's point even where the data do not identify it: never printed
        "penalised_lr50": f.lr50,
        "bounds": list(f.bounds),
        "identified": f.identified,
        "failed": f.failed,
        "finished": f.n,
        "top_lr": f.top,
        "ends": [list(e) if e else None for e in f.ends],
        "text": lr50_cell(f),
    }


def measured_bits_per_nat(runs) -> float | None:
    """The factor from a val loss (nats per token) to bits per byte, as the runs measured it: their
    final val/bpb over their final val loss (one fixed eval set per study, so one constant; the
    median over runs that logged both), None where no run logged val/bpb."""
    ratios = sorted(
        r.summary["final_val_bpb"] / r.summary["final_val_loss"]
        for r in runs
        if r.summary.get("final_val_bpb") and r.summary.get("final_val_loss")
    )
    return ratios[len(ratios) // 2] if ratios else None


def as_json(res: StudyResult) -> dict:
    """report.json: what readme_results.py and the index read."""

    def pj(p):
        return {
            "n": p.n,
            "mean": p.mean,
            "ci": list(p.ci) if p.ci else None,
            "verdict": p.verdict,
            "mde": p.mde,
            "p": p.p_diff,
            "p_tost": p.p_tost,
        }

    def rj(r):
        return {
            "ratio": r.ratio if r.identified else None,
            "ci": list(r.ci) if r.identified and r.ci else None,
            "penalised_ratio": r.ratio,  # the fit's point even where not identified: never printed
            "bounds": list(r.bounds),
            "identified": r.identified,
            "p": r.p,
            "n": r.n,
            "failed": r.failed,
            "text": r.describe(),
        }

    def kj(a):
        return {f"{lr:g}": row for lr, row in a.kinds().items()}

    def sj(s):
        return {
            "mean": s.mean,
            "ci": list(s.ci) if s.ci else None,
            "n": len(s.per_seed),
            "lrs": list(s.lrs),
            "l_star": s.l_star,
            "best_lr": s.best_lr,
            "bracketed": s.bracketed,
        }

    return {
        "name": res.file.name,
        "about": res.file.about,
        "runs": len(res.runs),
        "arms": len(res.arms),
        "arm_keys": res.keys,
        "steps": budgets_text(res.runs),
        "budgets": budgets(res.file.path),
        "running": {("all" if b is None else f"{b:g}"): st for b, st in res.running.items()},
        "wall_min": round(res.wall_s / 60, 1) if res.wall_s else None,
        "bits_per_nat": measured_bits_per_nat(res.runs),
        "margin": res.margin,
        "ratio_margin": res.file.ratio_margin,
        "sensitivity_margin": res.file.sensitivity_margin,
        "rule": res.file.rule.describe(),
        "alternatives": [r.name for r in res.file.alternatives],
        "selection_seeds": res.selection_seeds,
        "test_seeds": res.test_seeds,
        "common_seeds": res.common_seeds,
        "per_arm": {
            label: {
                "config": {k: a.runs[0].config.get(k) for k in res.keys},
                "best_lr": a.best_lr,
                **fit_json(res.failures[label]),
                "max_lr_ok": a.max_lr_ok,
                "alternatives": {n: fit_json(f[label]) for n, f in res.alternatives.items()},
                "sensitivity": sj(res.sensitivity[label]) if label in res.sensitivity else None,
                "sensitivity_size": sj(res.sensitivity_size[label])
                if label in res.sensitivity_size
                else None,
                "instability": fit_json(res.instability[label])
                if label in res.instability
                else None,
                "kinds": kj(a),
            }
            for label, a in res.arms.items()
        },
        "comparisons": [
            {
                "A": c.a.label,
                "B": c.b.label,
                "key": c.key,
                "lr50_ratio": rj(c.ratio),
                "lrs": list(c.loss.lrs) if c.loss.lrs else None,
                "loss": pj(c.loss.paired),
                "dropped": c.loss.dropped,
                "tost_needs": c.loss.needed,
            }
            for c in res.comparisons
        ],
        "claims": [
            {
                **{k: c.claim[k] for k in ("paper", "says", "metric", "expect")},
                "A": c.a,
                "B": c.b,
                "estimate": c.estimate,
                "p": c.p,
                "p_holm": c.p_holm,
                "agreement": c.agreement,
                "note": c.note,
                **({"lr50_ratio": rj(c.ratio)} if c.ratio else {}),
                **(
                    {
                        "lrs": list(c.nested.lrs) if c.nested.lrs else None,
                        "loss": pj(c.nested.paired),
                        "how": c.nested.how,
                        "gaps": [list(x) for x in c.nested.gaps],
                    }
                    if c.nested
                    else {}
                ),
                **(
                    {
                        "size_l_star": {
                            "estimate": c.size.estimate,
                            "p": c.size.p,
                            "p_holm": c.size.p_holm,
                            "agreement": c.size.agreement,
                            "loss": pj(c.size.nested.paired),
                        }
                    }
                    if c.size
                    else {}
                ),
                **({"rules": {name: rj(r) for name, r in c.rules.items()}} if c.rules else {}),
            }
            for c in res.claims
        ],
        "withdrawn": res.file.withdrawn,
        "history": history(res.file.name, res.file.history),
        "trends": [
            {
                "what": t.what,
                "pair": t.pair,
                "axis": t.axis,
                "per_doubling": t.log2,
                "points": [[x, e, list(ci) if ci else None] for x, e, ci in t.points],
                "slope": t.slope,
                "ci": list(t.ci) if t.ci else None,
                "used": t.used,
            }
            for t in res.trends
        ],
    }


def write_report(paths: list[Path], out: Path, margin: float | None = None) -> Path:
    """report.md, report.json and the figures in `out`, from the runs under `paths`; ValueError when
    there are none. The equivalence margin: `margin`, else the study file's `equivalence_margin`,
    else 0.02 nats."""
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


KEPT = (
    "optim.lr",
    "train.seed",
    "train.steps",
    "log.plateau_margin",
    "log.blowup_margin",
    "log.flat_horizon",
)
SUMMARY = (
    "status",
    "final_val_loss",
    "best_val_loss",
    "final_val_bpb",
    "unigram_entropy",
    "diverged_at",
    "dead_gradients_at",
    "tokens_per_s",
)


def runs_json(res: StudyResult) -> list[dict]:
    """Every run as the report read it, small enough to commit: the arm's fields, LR, seed and
    outcome thresholds, the summary's outcome numbers and the val curve, so a later protocol can
    judge and decide again (study/archive.py) without the run directories."""
    return [
        {
            "name": r.name,
            "config": {k: r.config.get(k) for k in (*res.keys, *KEPT)},
            "summary": {k: r.summary.get(k) for k in SUMMARY},
            "val": [[e["step"], e["val/loss"]] for e in r.records if e.get("val/loss") is not None],
        }
        for r in sorted(res.runs, key=lambda r: r.name)
    ]
