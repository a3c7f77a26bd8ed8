"""report.md of a study, answer first: the verdicts and one figure, then what the numbers show, the
claims in full, the arms, the exploratory tables, the figures, how the study was run, every run.
lab/result.py computes; lab/record.py writes report.json and runs.json; this file only renders."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lab import centring, multiples
from lab.archive import RUNS, runs_bytes
from lab.arms import mean_of
from lab.claims import claim_sentence
from lab.figures import figures
from lab.findings import findings, margin_sentence
from lab.history import history
from lab.lr50 import bound_text
from lab.precursors import table as precursor_table
from lab.protocol import adaptive_outcome, round_runs
from lab.read import KINDS, last_half
from lab.record import as_json, budgets, budgets_text, runs_json
from lab.result import StudyResult, compute
from lab.text import BUDGET, bare, fmt, g, interval, lr50_cell
from training.rundir import read_json, write_bytes, write_text


def table(head: str, rows: list) -> list[str]:
    """A markdown table from its header ('a | b') and rows (lists of cells, or finished lines)."""
    cells = lambda r: r if isinstance(r, str) else "| " + " | ".join(map(str, r)) + " |"  # noqa: E731
    return [f"| {head} |", "|" + "---|" * (head.count(" | ") + 1), *map(cells, rows)]


def ratio_cells(r) -> tuple[str, str]:
    """(LR50 ratio, its 95% CI): numbers only where both LR50s are identified, else the ratios the
    arms' brackets allow and no interval."""
    if r.identified:
        level = "" if r.level == 0.95 else f", {100 * r.level:.3g}% for its looks"
        return fmt(r.ratio, ".3g"), interval(r.ci) + level
    return f"{bound_text(*r.bounds)} (brackets)", "-"


def estimate(c) -> str:
    """A claim's number for the verdicts table: the LR50 ratio or the paired loss difference."""
    if c.agreement == "running":
        return "-"
    if c.ratio is not None:
        ratio, ci = ratio_cells(c.ratio)
        return f"LR50 ratio {ratio}" + (f" ({ci})" if c.ratio.identified else "")
    p = c.nested.paired
    return "-" if p.mean is None else f"{p.mean:+.3f} nats ({interval(p.ci, '+.3f')}), n = {p.n}"


def verdicts(res: StudyResult) -> list[str]:
    """The first screen: every claim's verdict and number."""
    rows = [
        f"| {c.claim['says']} | {c.a} vs {c.b} | **{c.agreement}** | {estimate(c)} | "
        f"{fmt(c.p_holm, '.2g')} |"
        for c in res.claims
        if c.a is not None
    ]
    return (
        [*table("claim | A vs B | verdict | estimate (95% CI) | Holm p", rows), ""] if rows else []
    )


def by_budget(res: StudyResult) -> list[str]:
    """Along a budget axis: each claim's verdict at each budget side by side, and whether it holds
    at every budget (small-scale verdicts can flip with the budget)."""
    if BUDGET not in res.keys:
        return []
    steps = lambda label: int(res.arms[label].runs[0].config[BUDGET])  # noqa: E731
    pending = {int(b) for b in res.running if b is not None}  # a budget not begun has no arms
    tested = [c for c in res.claims if c.a is not None]
    budgets_ = sorted({steps(c.a) for c in tested} | pending)
    rows: dict[tuple, dict] = {}
    for c in tested:
        if steps(c.a) == steps(c.b):
            rows.setdefault((c.claim["says"], bare(c.a), bare(c.b)), {})[steps(c.a)] = c
    out = []
    for (says, a, b), at in rows.items():
        cells = [
            at[s].agreement if s in at else "running" if s in pending else "not run"
            for s in budgets_
        ]
        whole = (
            "not known yet"
            if "running" in cells
            else f"holds: {cells[0]}"
            if len(set(cells)) == 1 and len(at) == len(budgets_)
            else "changes with the budget"
        )
        shown = [
            f"**{v}**, Holm p {fmt(at[s].p_holm, '.2g')}" if s in at and v != "running" else v
            for s, v in zip(budgets_, cells, strict=True)
        ]
        out.append([says, f"{a} vs {b}", *shown, whole])
    head = " | ".join(["claim", "A vs B", *(f"{s} steps" for s in budgets_), "at every budget"])
    return [*table(head, out), ""] if out else []


def interim(res: StudyResult) -> list[str]:
    """Where the protocol's stages have not all run: which, and what that means for the claims."""
    if not res.running:
        return []
    where = "; ".join(
        f"{'' if b is None else f'at {b:g} steps, '}from the {stage} stage on"
        for b, stage in sorted(res.running.items(), key=lambda x: (x[0] is not None, x[0] or 0))
    )
    return [
        f"**Interim report**: the protocol's stages have not all run ({where}); the sweep resumes "
        "them. Their claims are `running`: not decided, in the Holm family with p = 1. Runs in "
        "flight (no outcome in sweep.json yet) are not read.",
        "",
    ]


def claims(res: StudyResult) -> list[str]:
    if not res.claims and not res.file.withdrawn:
        return []
    out = [
        "## Claims (pre-registered)",
        "",
        f"Each decided by its primary test alone, Holm-adjusted over the family of all "
        f"{len(res.claims)} (a claim its runs cannot test is in it with p = 1): `agrees` / "
        "`disagrees` need an adjusted p < 0.05; anything else is `cannot tell`.",
        "",
        *(f"- {claim_sentence(c)}" for c in res.claims),
    ]
    for w in res.file.withdrawn:
        out.append(f"- **{w['paper']}**: {w['says']}: **withdrawn**: {w['why']}")
    return [*out, ""]


def sensitivity_cell(res: StudyResult, label: str) -> str:
    s, size = res.sensitivity.get(label), res.sensitivity_size.get(label)
    if s is None or s.mean is None:
        return "-"
    text = (
        f"{s.mean:.3f}"
        + (f" ({interval(s.ci, '.3f')})" if s.ci else "")
        + f", n = {len(s.per_seed)}"
    )
    if not s.bracketed:
        text += f", best LR {s.best_lr:g}: not bracketed"
    if size is not None and size.mean is not None and abs(size.mean - s.mean) > 5e-4:
        text += f"; per-size L*: {size.mean:.3f}"
    return text


def arms_table(res: StudyResult) -> list[str]:
    """Per arm: best LR, its loss, LR50 under the main rule and under instability alone, LR
    sensitivity, the runs' labels, spike scores and speed."""
    seeds = lambda values: (  # noqa: E731
        ", ".join(f"{v:.3f}" for _, v in sorted(values.items(), key=lambda t: str(t[0]))) or "-"
    )
    rows = []
    for label, a in res.arms.items():
        c, lr, unstable = a.outcomes(), a.best_lr, res.instability.get(label)
        sel, test = (a.losses(lr, s) if lr else {} for s in (res.selection_seeds, res.test_seeds))
        labels = " / ".join(
            str(c[k]) for k in ("ok", "plateau", "collapsed", "unstable", "diverged")
        )
        rows.append(
            f"| {label} | {fmt(lr, 'g')} | {seeds(sel)} / {seeds(test)} | "
            f"{lr50_cell(res.failures[label])} | {lr50_cell(unstable) if unstable else '-'} | "
            f"{sensitivity_cell(res, label)} | {len(a.slow())} | "
            f"{labels} / {c['failed'] + c['interrupted']} | "
            f"{fmt(a.summary_mean('spike_score/loss'), '.2f')} / "
            f"{fmt(a.summary_mean('spike_score/grad_norm'), '.2f')} | "
            f"{fmt(a.tokens_per_s(), ',.0f')} |"
        )
    head = (
        "arm | best LR | final val loss there: selection / test seeds | LR50 (main rule) | "
        "LR50 (instability alone) | LR sensitivity (nats, 95% CI) | failed below the floor (slow) "
        "| ok / plateau / collapsed / unstable / diverged / crashed | spike score loss / grad norm "
        "| tokens/s"
    )
    return ["## Arms", "", *table(head, rows), ""]


def rules_table(res: StudyResult) -> list[str]:
    """Each arm's LR50 under every failure rule of the study file, and which arms it moves."""
    if not res.alternatives:
        return []
    names = list(res.alternatives)
    rows = [
        [label, lr50_cell(fit), *(lr50_cell(res.alternatives[n][label]) for n in names)]
        for label, fit in res.failures.items()
    ]
    described = "; ".join(f"{r.name}: {r.describe()}" for r in res.file.alternatives)
    return [
        "## Failure rules",
        "",
        f"The study file's alternative rules, the same runs judged again: {described}.",
        "",
        *table(" | ".join(["arm", "main rule", *names]), rows),
        "",
        rule_sensitivity(res),
        "",
    ]


def rule_sensitivity(res: StudyResult) -> str:
    """Which arms' LR50 changes with the rule (identified under one and not another, or apart by
    more than x1.25): a verdict resting on them depends on the rule."""

    def differ(a, b) -> bool:
        if a.identified != b.identified:
            return True
        if a.identified:
            return max(a.lr50, b.lr50) / min(a.lr50, b.lr50) > 1.25
        return a.bounds != b.bounds

    moved = []
    for label, fit in res.failures.items():
        others = [f[label] for f in (*res.alternatives.values(), res.instability) if label in f]
        if any(differ(fit, o) for o in others):
            moved.append(f"{label} ({'; '.join(lr50_cell(f) for f in [fit, *others])})")
    if not moved:
        return "Every arm's LR50 reads the same under every rule."
    return (
        f"LR50 depends on the rule for: {', '.join(moved)} (main; the alternatives in the order "
        "above; instability alone). A verdict resting on these arms' LR50s depends on the rule."
    )


MAX_LR_ROWS = 8  # an arm with more failing LRs (a bisected study) is read per half-decade band


def lr_bands(rows: dict[float, dict[str, int]]) -> list[tuple[str, dict[str, int]]]:
    """An arm's per-LR rows as (lr cell, counts): each LR alone where there are at most
    MAX_LR_ROWS, else summed over the half-decade band around each grid point (10^(k/2) / 1.78 to
    x1.78, k = round(2 log10 lr)), the cell naming the LRs' range and count."""
    if len(rows) <= MAX_LR_ROWS:
        return [(f"{lr:g}", row) for lr, row in rows.items()]
    bands: dict[int, list[float]] = {}
    for lr in rows:
        bands.setdefault(round(2 * math.log10(lr)), []).append(lr)
    out = []
    for lrs in bands.values():
        total = {k: sum(rows[lr][k] for lr in lrs) for k in rows[lrs[0]]}
        cell = f"{lrs[0]:g}" if len(lrs) == 1 else f"{lrs[0]:g}-{lrs[-1]:g} ({len(lrs)} LRs)"
        out.append((cell, total))
    return out


def kinds_table(res: StudyResult) -> list[str]:
    """Failures by kind per arm and LR or LR band (lr_bands, docs/METHODS.md); [] if none."""
    rows = [
        (label, cell, row)
        for label, a in res.arms.items()
        for cell, row in lr_bands(
            {lr: row for lr, row in a.kinds().items() if row["trained"] < row["runs"]}
        )
    ]
    if not rows:
        return []
    kinds = [k for k in KINDS if any(row[k] for _, _, row in rows)]
    return [
        "## Failures by kind",
        "",
        "Each failed run's kind, read from its eval curve by the study file's thresholds: "
        "collapsed (its last half at or above the unigram entropy minus the learn margin), blew "
        f"up, non-finite, slow (still falling faster than {res.file.rule.slow_slope:g} nats per "
        "10% of the budget: still learning when the budget ended, censored for instability), "
        "stalled. LRs where every run trained are left out; an arm that failed at more than "
        f"{MAX_LR_ROWS} LRs (a bisected study) is summed over half-decade bands of LR, each "
        "named by the range of its LRs.",
        "",
        *table(
            " | ".join(["arm", "lr", "runs", "trained", *kinds]),
            [
                [label, cell, r["runs"], r["trained"], *(r[k] for k in kinds)]
                for label, cell, r in rows
            ],
        ),
        "",
    ]


def comparisons(res: StudyResult) -> list[str]:
    if not res.comparisons:
        return []
    rows = []
    for c in res.comparisons:
        r, p = c.ratio, c.loss.paired
        rows.append(
            f"| {c.a.label} | {c.b.label} | {c.key} | {' | '.join(ratio_cells(r))} | "
            f"{fmt(r.p, '.2g')} | {fmt(p.mean, '+.3f')} | {interval(p.ci, '+.3f')} | {p.n} | "
            f"{p.verdict} | {fmt(p.p_tost, '.3g')} | {fmt(p.mde)} | "
            f"{'; '.join(c.loss.dropped) or '-'} |"
        )
    head = "A | B | differ in | LR50 A / B | 95% CI | p | A - B (nats) | 95% CI | n | verdict | "
    head += "TOST p | MDE | left out"
    return [
        "## Arms compared (exploratory)",
        "",
        "Every pair of arms that differ in one field; not the claims, not corrected for "
        "multiplicity. Stability: LR50_A / LR50_B (one slope, 95% profile CI; where an arm is only "
        "bracketed, the ratios the brackets allow). Loss: A - B at each one's best LR on the test "
        "seeds where both trained (nested, paired).",
        "",
        *table(head, rows),
        "",
        margin_sentence(res),
        "",
    ]


def convergence(res: StudyResult) -> list[str]:
    """At each arm's best LR, the runs' end-of-run slope: have the curves flattened when the budget
    ends? (Norms compared on runs still falling compare speed, not where they converge.)"""
    rows, flat = [], res.file.rule.slow_slope
    for label, arm in res.arms.items():
        done = [r for r in arm.at(arm.best_lr) if r.trained] if arm.best_lr else []
        slopes = [b for b in (last_half(r)[1] for r in done) if b is not None]
        if slopes:
            mean = sum(slopes) / len(slopes)
            curve = "flat" if abs(mean) <= flat else "still falling" if mean < 0 else "rising"
            spread = f"{mean:+.3f} ({min(slopes):+.3f}..{max(slopes):+.3f}), n = {len(slopes)}"
            rows.append(
                [label, g(arm.best_lr), fmt(mean_of([r.final for r in done])), spread, curve]
            )
    if not rows:
        return []
    head = "arm | best LR | final val loss | end-of-run slope: mean (min..max) | curve"
    return [
        "## Convergence at each arm's best LR",
        "",
        f"The slope of the last half of each run's evals, in nats per 10% of its budget (flat: "
        f"within {flat:g}, the study's `slow_slope`).",
        "",
        *table(head, rows),
        "",
    ]


def adaptive_stage(res: StudyResult) -> list[str]:
    """Per LR50 claim, where the adaptive edge stage stopped and the runs its rounds made."""
    p = res.file.protocol
    if p is None or p.adaptive is None:
        return []
    rows = []
    for c in res.claims:
        if c.a is None or c.claim["metric"] != "lr50" or c.agreement == "running":
            continue
        a, b = res.arms[c.a].runs, res.arms[c.b].runs
        ended, used = adaptive_outcome(
            a, b, c.claim["expect"], p, res.file.ratio_margin, len(res.claims)
        )
        spent = round_runs(a, b, p.adaptive)
        rows.append([c.claim["says"], f"{c.a} vs {c.b}", ended, used, spent, f"**{c.agreement}**"])
    a = p.adaptive
    return [
        "## The adaptive edge stage",
        "",
        f"Rounds of {a.seeds_per_round} new seeds at {a.lrs} LRs x{a.step:.3g} apart around each "
        f"arm's LR50 estimate, at most {a.max_runs} runs a claim ({a.rounds} rounds, {a.looks} "
        f"looks); a claim stops at the first look where looks x p < {a.alpha:g} / "
        f"{len(res.claims)} (the Holm family).",
        "",
        *table("claim | A vs B | the stage | its runs | at its arms | verdict", rows),
        "",
    ]


def per_lr(res: StudyResult) -> list[str]:
    """Every LR both arms of a pair ran; where a pair ran more than MAX_LR_ROWS LRs (a bisected
    study), only those with a paired test (n >= 2)."""
    if not res.per_lr:
        return []
    lrs: dict[tuple[str, str], int] = {}
    for a, b, *_ in res.per_lr:
        lrs[a.label, b.label] = lrs.get((a.label, b.label), 0) + 1
    kept = [
        row for row in res.per_lr if row[4].n >= 2 or lrs[row[0].label, row[1].label] <= MAX_LR_ROWS
    ]
    rows = [
        f"| {a.label} | {b.label} | {key} | {lr:g} | {p.n} | {fmt(p.mean, '+.3f')} | "
        f"{interval(p.ci, '+.3f')} | {p.verdict} | {fmt(p.p_diff, '.3g')} |"
        for a, b, key, lr, p in kept
    ]
    left = len(res.per_lr) - len(kept)
    return [
        "## Per-LR paired differences (exploratory)",
        "",
        "Every LR both arms ran, over every seed where both trained; not corrected for "
        "multiplicity and not nested (the LRs were chosen on these seeds): for orientation only."
        + (
            f" Where a pair ran more than {MAX_LR_ROWS} LRs (a bisected study), the {left} LRs "
            "with fewer than 2 seeds trained in both arms (no paired test) are left out."
            if left
            else ""
        ),
        "",
        *table("A | B | differ in | lr | n | A - B | 95% CI | verdict | p", rows),
        "",
    ]


def budget_text(path: Path | None) -> str:
    """The budget per run in tokens per parameter, all parameters and non-embedding ones (Kaplan et
    al. 2020's N), one phrase per distinct budget of the arms; '' without a file."""
    n = lambda values: "-".join(f"{v:,}" for v in sorted(set(values)))  # noqa: E731
    found = [
        f"{b['tokens'] / 1e6:.3g}M tokens ({b['steps']} steps of "
        f"{b['batch'][0]} x {b['batch'][1]}) "
        f"= {b['per_parameter']} tokens per parameter ({n(b['parameters'])}), "
        f"{b['per_non_embedding']} per non-embedding parameter ({n(b['non_embedding_parameters'])})"
        for b in budgets(path)
    ]
    return f"Budget per run: {'; '.join(found)}." if found else ""


def design(res: StudyResult) -> list[str]:
    """How the study was run and decided: its size, seeds, budget, rule and statistics."""
    f, runs = res.file, res.runs
    every = sorted({r.lr for r in runs})
    lrs = (
        ", ".join(f"{x:g}" for x in every)
        if len(every) <= 20  # a grid, refined or not; a bisected study's are its range
        else f"{len(every)} from {every[0]:g} to {every[-1]:g}"
    )
    steps = budgets_text(runs)
    how = "the study's protocol" if f.protocol else "the lowest 40% of the seeds (no protocol)"
    common = f", common seeds {', '.join(map(str, res.common_seeds))}" if res.common_seeds else ""
    rule = (
        f"Failure, fixed in the study file before the runs: {f.rule.describe()}."
        if f.given
        else f"No study file was given: a run failed if it had {f.rule.describe()}."
    )
    out = [
        "## How this study was run and decided",
        "",
        f"{len(runs)} runs in {len(res.arms)} arms "
        f"(arms differ in: {', '.join(res.keys) or 'nothing'});"
        f" learning rates {lrs}{f'; {steps} steps per run' if steps else ''}"
        + (f"; {res.wall_s / 60:.1f} min with at least one run in flight" if res.wall_s else "")
        + f". Selection seeds {', '.join(map(str, res.selection_seeds)) or 'none'}, test seeds "
        f"{', '.join(map(str, res.test_seeds)) or 'none'}{common} ({how}).",
        "",
        *([budget_text(f.path), ""] if f.path else []),
        f"{rule} A failed run is an outcome, never a loss. Stability: per arm, P(fail | lr) fitted "
        "as a logistic curve in log10 lr with Firth's penalty, from the lowest LR where every "
        "selection seed trained up; LR50 is a number where some LR has both failed and trained "
        "runs and >= 2 failed, else the bracket its runs give. Two arms' LR50 ratio: one slope, "
        "likelihood-ratio p. LR sensitivity (Wortsman et al. 2023): the mean over the LR grid of "
        "min(L, L0) - L*, per seed, 95% t CI. Loss: each arm's best LR chosen on the selection "
        "seeds and compared on the test seeds, paired by seed (95% t CI, TOST at the margin, the "
        "minimum detectable difference). The claims are decided by one primary test each, "
        "Holm-adjusted; every other table is exploratory (normlab's docs/METHODS.md).",
        "",
    ]
    if len(res.designs) > 1:  # the study file changed between runs, with a note why
        out += [
            "The study file changed between its runs (lab/design.py); runs by design:",
            "",
            *(
                f"- design {d['hash']} (since {d['since']}, {d['runs']} runs)"
                + (
                    f": changed {', '.join(d['changed'])}; why: {d['why']}"
                    if d.get("changed")
                    else ""
                )
                for d in res.designs
            ),
            "",
        ]
    if len(res.builds) > 1:  # resumed on other machines: not one build's numbers
        out += [
            f"Its runs were made by {len(res.builds)} builds (meta.json: torch and the fused "
            "kernels, whose build name hashes the CPU of a -march=native build): "
            + "; ".join(f"{b['runs']} runs by {b['build']}" for b in res.builds)
            + ". Builds can differ in the last bits of a number, and a run at its failure edge "
            "in its outcome.",
            "",
        ]
    past = history(f.name, f.history)
    if past:
        out += [
            "The study file was changed after results of it (or of a pilot) were committed; the "
            "runs are judged by the file as it is now:",
            "",
            *(f"- {h}" for h in past),
            "",
        ]
    return out


def runs_table(res: StudyResult) -> list[str]:
    rows = []
    for r in sorted(res.runs, key=lambda r: r.name):
        s = r.summary
        rule = "-" if not r.finished else ("trained" if r.trained else f"failed: {r.why}")
        rows.append(
            f"| {r.name} | {r.status} | {fmt(s.get('final_val_loss'))} | "
            f"{fmt(s.get('best_val_loss'))} | {fmt(s.get('diverged_at'), 'd')} | "
            f"{fmt(r.init_loss)} | {fmt(s.get('tokens_per_s'), ',.0f')} | {rule} |"
        )
    head = (
        "run | status | final val loss | best val loss | diverged at | L0 | tokens/s | study rule"
    )
    return ["## Runs", "", *table(head, rows)]


def multiples_section(res: StudyResult) -> list[str]:
    """Loss at multiples of the best LR (a study file's multiples:), lab/multiples.py."""
    spec = res.file.multiples
    if spec is None:
        return []
    rows = multiples.compare(res.runs, spec, res.margin)
    return multiples.table(rows, multiples.outcomes(res.runs, spec, res.keys), spec)


def render(res: StudyResult, made: list[tuple[str, str]]) -> str:
    """report.md: the answer first (verdicts, one figure), then the evidence, then the design."""
    first = next(((f, c) for f, c in made if f == "stability_map.png"), made[0] if made else None)
    lines = [
        f"# {res.file.name}",
        "",
        *([res.file.about, ""] if res.file.about else []),
        *interim(res),
        # along a budget axis the first screen is each claim by budget, then every estimate
        *(by_budget(res) or verdicts(res)),
        *([f"![{first[1]}]({first[0]})", ""] if first else []),
        *(["## Every claim at every budget", "", *verdicts(res)] if by_budget(res) else []),
        "## What the numbers show",
        "",
        *(f"- {s}" for s in findings(res)),
        "",
        *claims(res),
        *multiples_section(res),
        *centring.table(res),
        *arms_table(res),
        *rules_table(res),
        *kinds_table(res),
        *precursor_table(
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
        ),
        *comparisons(res),
        *convergence(res),
        *adaptive_stage(res),
        *([] if not res.trends else ["## Trends (exploratory)", ""]),
        *(f"- {t.describe()}." for t in res.trends),
        *([""] if res.trends else []),
        *per_lr(res),
        "## Figures",
        "",
    ]
    for fname, caption in made:
        lines += [f"**{caption}**", "", f"![{caption}]({fname})", ""]
    lines += design(res) + runs_table(res)
    return "\n".join(lines) + "\n"


def failed_entries(paths: list[Path]) -> list[str]:
    """Runs that crashed (sweep*.json: failed, with the error), as rows of the runs table."""
    rows = []
    for p in paths:
        for index in sorted(p.glob("sweep*.json")):  # sweep.json, or one per shard of a job array
            for e in read_json(index)["runs"]:
                if e.get("status") == "failed":
                    error = f"failed (exit {e['exit_code']}): {e.get('error', '')}"
                    rows.append(f"| {e['name']} | {error} | | | | | | |")
    return rows


def write_report(
    paths: list[Path], out: Path, margin: float | None = None, draw: bool = True
) -> Path:
    """report.md, report.json, runs.json and (unless not `draw`) the figures in `out`, from the runs
    under `paths`; ValueError when there are none. The equivalence margin: `margin`, else the study
    file's `equivalence_margin`, else 0.02 nats."""
    res = compute(paths, margin)
    out.mkdir(parents=True, exist_ok=True)
    made = figures(res, out) if draw else []
    rows = failed_entries(paths)
    path = out / "report.md"
    write_text(
        path, render(res, made).rstrip("\n") + ("\n" + "\n".join(rows) if rows else "") + "\n"
    )
    write_text(out / "report.json", json.dumps(as_json(res), indent=1) + "\n")
    write_bytes(out / RUNS, runs_bytes(runs_json(res)))
    (out / "runs.json").unlink(missing_ok=True)  # an older report's, uncompressed
    return path
