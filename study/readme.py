"""Write the README's Results blocks and the index of docs/results from the committed study reports,
never by hand.

Each block sits between `<!-- KIND: PATH -->` and `<!-- /KIND -->` and is replaced by what KIND
says. A block between `<!-- claims: FOLDER -->` and `<!-- /claims -->` gets one line per claim of
every report.json under FOLDER: the paper, the claim, agrees / disagrees / cannot tell, and the
estimate, CI, n and Holm-adjusted p behind it; `<!-- trends: FOLDER -->` gets every trend of those
reports along a numeric axis (width, depth): the estimate and CI at each value and the fitted slope
with its CI (study/trend.py), with a link to the figure. A block `<!-- replication: A,B -->` puts
two result folders of one study on two corpora side by side (claims, LR50s, LR sensitivity, the
common-LR loss in bits per byte) with a sentence saying which findings hold on both. A block `<!--
bynorm: A,B -->` gets one sentence per result folder: each of its claims that was tested under both
block norms, grouped by what the arms differ in, with the verdict and numbers under RMSNorm and
under LayerNorm blocks, and how many verdicts the block norm changed (and the LR-sensitivity slopes
per doubling of width, where fitted). A block `<!-- found: FOLDER -->` gets the README's "What it
found": sentences generated from the default study's claims and every report's verdict counts, then
the table of FOLDER/questions.yaml (question | RMSNorm | LayerNorm | effect and 95% CI | verdict |
study; norm_cells says what each norm's column holds). A block between `<!--
bench: PATH.md -->` and `<!-- /bench -->` (docs/performance.md) gets a benchmark's saved output
(`--save PATH.md`: the command, the machine and its tables) as it was measured.

    python scripts/readme_results.py    # README.md, docs/performance.md, docs/results/README.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from study.text import BUDGET, bare, g, interval, steps_of

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"(<!-- (?P<kind>found|claims|trends|bench|replication|bynorm): (?P<path>\S+) -->\n)"
    r"(?P<body>.*?)"
    r"(<!-- /(?P=kind) -->)",
    re.S,
)


def ratio_text(r: dict) -> str:
    """'1.14 (95% CI 0.623..2.04, likelihood-ratio p = 0.64; 53 runs, 11 failed)' from
    report.json."""
    if "text" in r:  # the report's own sentence (a number where identified, else the bound)
        return r["text"].removeprefix("LR50 ratio ")
    if r["ratio"] is None and r["ci"]:  # each arm one outcome: a bound only
        lo, hi = r["ci"]
        bound = f"below {g(hi)}" if hi is not None else f"above {g(lo)}"
        return (
            f"{bound} (one arm failed at every LR, the other at none; likelihood-ratio p = "
            f"{r['p']:.2g}; "
            f"{r['n']} runs)"
        )
    if r["ratio"] is None:
        return f"not estimable ({r['failed']} of {r['n']} runs failed)"
    return (
        f"{g(r['ratio'])} (95% CI {interval(r['ci'])}, likelihood-ratio p = {r['p']:.2g}; {r['n']} "
        "runs, "
        f"{r['failed']} failed)"
    )


def bracket_text(bounds) -> str:
    """'in 0.01..0.316 (brackets only)': what separated arms allow of a ratio."""
    lo, hi = bounds
    inner = (
        f"in {g(lo)}..{g(hi)}"
        if lo and hi
        else f"> {g(lo)}"
        if lo
        else f"< {g(hi)}"
        if hi
        else "not bounded"
    )
    return inner + " (brackets only)"


def _times(c: dict) -> tuple[list[float], list[tuple]]:
    """(1/ratio of every rule that identifies a post/pre LR50 ratio, the brackets of those that do
    not), over the study file's rules: the main one, its alternatives and instability alone."""
    fits = [c["lr50_ratio"], *c.get("rules", {}).values()]
    nums = [1 / f["ratio"] for f in fits if f.get("identified") and f.get("ratio")]
    brackets = [
        tuple(1 / b if b else None for b in f["bounds"][::-1])
        for f in fits
        if not f.get("identified") and f.get("bounds")
    ]
    return nums, brackets


def placement_sentence(place: list[dict]) -> str:
    """Post-LN's LR50 below Pre-LN's, the range over the pre-registered rules: identified ratios as
    numbers, the others as brackets."""
    parts = []
    for c in place:
        nums, brackets = _times(c)
        n = 1 + len(c.get("rules", {}))
        got = (
            (f"{min(nums):.1f}-{max(nums):.1f}x" if len(nums) > 1 else f"{nums[0]:.1f}x")
            if nums
            else ""
        )
        lo = min((b[0] for b in brackets if b[0]), default=None)
        hi = max((b[1] for b in brackets if b[1]), default=None)
        br = (
            f"{g(lo)}-{g(hi)}x"
            if lo and hi
            else f"> {g(lo)}x"
            if lo
            else f"< {g(hi)}x"
            if hi
            else "open"
        )
        verb = "brackets" if len(brackets) == 1 else "bracket"
        tail = f"; {len(brackets)} only {verb} it, {br})" if brackets else ")"
        text = (
            f"{got} ({len(nums)} of {n} rules identify it{tail}"
            if nums
            else f"{br} (every rule brackets it)"
        )
        parts.append(f"{_common(c)}: {text}, {c['agreement']} (Holm p = {c['p_holm']:.2g})")
    return (
        "Where the norm sits decides stability: Post-LN fails at learning rates below those Pre-LN "
        "trains at, "
        "by " + "; ".join(parts) + "."
    )


def loss_text(p: dict) -> str:
    """'+0.020 nats (95% CI -0.021..+0.060, n = 3 seeds, inconclusive)' from report.json."""
    if p["mean"] is None:
        return "no seed where both runs trained"
    ci = f"95% CI {p['ci'][0]:+.3f}..{p['ci'][1]:+.3f}, " if p["ci"] else ""
    return f"{p['mean']:+.3f} nats ({ci}n = {p['n']} seed{'s' * (p['n'] != 1)}, {p['verdict']})"


def _short(c: dict) -> str:
    """A claim's estimate in a table cell: the ratio or difference with its CI, n and Holm p."""
    if c.get("agreement") == "running":
        return "running (its stages have not all run)"
    if "lr50_ratio" in c:
        r = c["lr50_ratio"]
        if r["ratio"] is None:
            text = "LR50 ratio " + bracket_text(r.get("bounds") or [None, None])
        else:
            text = f"LR50 ratio {g(r['ratio'])} ({interval(r['ci'])})"
    else:
        p = c["loss"]
        if p["mean"] is None:
            return "no seed where both trained"
        ci = f" ({p['ci'][0]:+.3f}..{p['ci'][1]:+.3f})" if p["ci"] else ""
        text = f"{p['mean']:+.3f} nats{ci}, n = {p['n']}"
    return text + (f", Holm p = {c['p_holm']:.2g}" if c.get("p_holm") is not None else "")


def _common(c: dict) -> str:
    """What a claim's two arms share (their fixed context): layernorm for layernorm/post vs
    layernorm/pre."""
    b = c["B"].split("/")
    return "/".join(part for part in c["A"].split("/") if part in b) or c["A"]


def _matching(report: dict, want: dict) -> list[dict]:
    return [
        c
        for c in report.get("claims", [])
        if c.get("A") and all(c.get(k) == v for k, v in want.items())
    ]


WORDS = {
    "lr50": "LR50",
    "lr_sensitivity": "LR sensitivity",
    "common_loss": "loss at a common safe LR",
    "best_loss": "loss at each one's best LR",
}


def _norm_sentence(norm: list[dict], report: dict) -> str:
    """What the norm claims say in plain words: what is the same (within the margins set before the
    runs), what differs, and what these runs cannot tell, each with where (which placements)."""
    m, r, sm = (
        report.get("margin", 0.02),
        report.get("ratio_margin", 2),
        report.get("sensitivity_margin", 0.1),
    )
    what = {
        "common_loss": f"the same final loss at a learning rate safe for both (within {m:g} nats",
        "best_loss": f"the same final loss at each one's best learning rate (within {m:g} nats",
        "lr50": f"the same stability (LR50 within x{r:g}",
        "lr_sensitivity": f"the same sensitivity to the learning rate (within {sm:g} nats",
    }
    same, differ, open_ = [], [], []
    for metric in ("common_loss", "best_loss", "lr50", "lr_sensitivity"):
        for verdict, out in (("agrees", same), ("disagrees", differ), ("cannot tell", open_)):
            cs = [c for c in norm if c["metric"] == metric and c["agreement"] == verdict]
            if cs:
                where = (
                    "both placements"
                    if len(cs) == 2 and len({_common(c) for c in cs}) == 2
                    else ", ".join(f"{_common(c)}-norm" for c in cs)
                )
                out.append(f"{what[metric]}, {where})")
    parts = []
    common = [c for c in norm if c["metric"] == "common_loss" and c.get("gaps")]
    for c in common:
        gaps = [gp for gp in c["gaps"] if gp[1] is not None]
        if not gaps:
            continue
        xs = sorted({g(gp[2]) for gp in gaps})
        nats = [gp[3] for gp in gaps if gp[3] is not None]
        span = (
            f"{min(nats):+.2f}..{max(nats):+.2f}"
            if len(nats) > 1
            else (f"{nats[0]:+.2f}" if nats else "")
        )
        note = f"{_common(c)}: lr {g(c['lrs'][0])}, " + (
            "each one's own best LR"
            if xs == ["1"]
            else f"x{'/'.join(xs)} each one's own best LR"
            + (f", {span} nats above its best loss" if span else "")
        )
        c["_gap_note"] = note
    notes = "; ".join(c["_gap_note"] for c in common if c.get("_gap_note"))
    if same:
        parts.append("RMSNorm and LayerNorm have " + " and ".join(same))
    if differ:
        parts.append("they do not have " + " and ".join(differ))
    if open_:
        parts.append("whether they have " + " and ".join(open_) + ", these runs cannot tell")
    gap = f" The common LR: {notes}." if notes else ""
    return "Which norm sits there: " + "; ".join(parts) + "." + gap


def _x(v: float) -> str:
    """A factor as a reader says it: two significant digits, whole numbers from 100."""
    return f"{v:.0f}" if v >= 100 else f"{v:.2g}"


def _span(c: dict) -> str:
    """A post/pre LR50 factor over the pre-registered rules: '3.8-25x (3 of 4 rules; 1 only brackets
    it)'."""
    nums, brackets = _times(c)
    n = 1 + len(c.get("rules", {}))
    if nums:
        text = (
            f"{_x(min(nums))}-{_x(max(nums))}x"
            if max(nums) > 1.05 * min(nums)
            else f"{_x(nums[0])}x"
        )
        verb = "brackets" if len(brackets) == 1 else "bracket"
        return text + (
            f" ({len(nums)} of {n} rules; {len(brackets)} only {verb} it)"
            if brackets
            else f" (all {n} rules)"
        )
    lo = min((b[0] for b in brackets if b[0]), default=None)
    hi = max((b[1] for b in brackets if b[1]), default=None)
    return (
        f"{_x(lo)}-{_x(hi)}x"
        if lo and hi
        else f"more than {_x(lo)}x"
        if lo
        else "an unbounded factor"
    ) + " (brackets only)"


def headline_placement(place: list[dict]) -> str:
    """One sentence: Post-LN's LR50 below Pre-LN's, per block norm, with the Holm p."""
    if not all(c["agreement"] == "agrees" for c in place):
        return "**Placement**: " + "; ".join(f"{_common(c)}: {c['agreement']}" for c in place) + "."
    p = max(c["p_holm"] for c in place)
    names = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
    return (
        "**Placement decides stability.** Post-LN's LR50 is below Pre-LN's by "
        + " and ".join(f"{_span(c)} with {names.get(_common(c), _common(c))}" for c in place)
        + f" (Holm p <= {p:.2g}; ranges over the pre-registered failure rules)."
    )


def _num(c: dict) -> str:
    """A claim's number with its CI, compact: '1.12 (0.889..1.41)', '-0.015 (-0.023..-0.007)', or
    the bracket where the ratio is not identified."""
    if "lr50_ratio" in c:
        r = c["lr50_ratio"]
        if r["ratio"] is None or not r.get("identified", True):
            return bracket_text(r.get("bounds") or [None, None])
        return f"{g(r['ratio'])} ({interval(r['ci'])})"
    p = c["loss"]
    if p["mean"] is None:
        return "no seed where both trained"
    return f"{p['mean']:+.3f}" + (f" ({p['ci'][0]:+.3f}..{p['ci'][1]:+.3f})" if p["ci"] else "")


def headline_norm(norm: list[dict], report: dict) -> str:
    """The mission's answer, one sentence per claim of RMSNorm vs LayerNorm (stability, the loss at
    an LR safe for both, LR sensitivity): its verdict in each placement with the numbers, their CIs,
    n and Holm p, and where the common LR sits below an arm's best."""
    m, r, sm = (
        report.get("margin", 0.02),
        report.get("ratio_margin", 2),
        report.get("sensitivity_margin", 0.1),
    )
    what = {
        "lr50": (f"as stable as LayerNorm (LR50 within x{r:g})", "LR50 ratio", ""),
        "common_loss": (f"as good at an LR safe for both (within {m:g} nats)", "loss", " nats"),
        "lr_sensitivity": (f"as sensitive to the LR (within {sm:g} nats)", "sensitivity", " nats"),
    }
    out = []
    for metric in ("lr50", "common_loss", "lr_sensitivity"):
        cs = [c for c in norm if c["metric"] == metric and c["agreement"] != "running"]
        if not cs:
            continue
        claim, name, unit = what[metric]
        ns = {c["loss"]["n"] for c in cs if c.get("loss")}
        nums = (
            f"{name} "
            + ", ".join(f"{_common(c)} {_num(c)}" for c in cs)
            + unit
            + (f", n = {ns.pop()}" if len(ns) == 1 else "")
            + ", Holm p "
            + ", ".join(f"{c['p_holm']:.2g}" for c in cs)
        )
        verdicts = [c["agreement"] for c in cs]
        if len(set(verdicts)) == 1:
            v = verdicts[0]
            where = "in both placements" if len(cs) == 2 else "in every placement"
            head = {
                "agrees": f"RMSNorm is {claim} {where}",
                "disagrees": f"RMSNorm is not {claim} {where}",
            }.get(v, f"{claim[0].upper()}{claim[1:]}: {v}")
        else:
            head = f"{claim[0].upper()}{claim[1:]}: " + ", ".join(
                f"{v} in {_common(c)}" for c, v in zip(cs, verdicts, strict=True)
            )
        far = [
            f"{_common(c)} at x{g(off[0][2])} its best LR"
            for c in cs
            if metric == "common_loss"
            and (off := [gp for gp in c.get("gaps", []) if not _at_best(gp)])
        ]
        out.append(f"{head} ({nums}{'; ' + ', '.join(far) if far else ''}).")
    return "**The norm**: " + " ".join(out) if out else ""


def _orders(fit: dict, higher: bool) -> bool:
    """Whether one rule's LR50 fit orders A above B (higher) or below it at p < 0.05: its ratio
    where identified, else a bracket wholly on that side of 1."""
    if fit.get("p") is None or fit["p"] >= 0.05:
        return False
    if fit.get("identified") and fit.get("ratio") is not None:
        return fit["ratio"] > 1 if higher else fit["ratio"] < 1
    lo, hi = fit.get("bounds") or [None, None]
    return (lo is not None and lo >= 1) if higher else (hi is not None and hi <= 1)


def rule_support(c: dict) -> str:
    """' (2 of 4 failure rules)' where an LR50 claim's ordering verdict (agrees or disagrees on a
    higher/lower claim) holds under only some of the study file's failure rules: the main one, whose
    verdict it is, and each alternative (instability alone among them) whose fit orders the arms so
    at p < 0.05 unadjusted; '' where it holds under all or the claim is not an ordering."""
    if c.get("metric") != "lr50" or c.get("expect") not in ("higher", "lower"):
        return ""
    if c.get("agreement") not in ("agrees", "disagrees") or not c.get("rules"):
        return ""
    higher = (c["expect"] == "higher") == (c["agreement"] == "agrees")
    k = 1 + sum(_orders(f, higher) for f in c["rules"].values())  # the main rule decided it
    n = 1 + len(c["rules"])
    return "" if k == n else f" ({k} of {n} failure rules)"


def _cell(cs: list[dict]) -> str:
    """Verdict cell naming each sub-test: 'post: agrees; pre: cannot tell', with the failure rules
    an ordering verdict holds under where not all (rule_support)."""
    if len(cs) == 1:
        return cs[0]["agreement"] + rule_support(cs[0])
    return "; ".join(f"{_common(c)}: {c['agreement']}{rule_support(c)}" for c in cs)


# The table's norm columns: each norm of the study's arms goes to its family's column (pRMSNorm is
# RMSNorm with its RMS estimated from a fraction of the features); a norm of neither family (dyt,
# none) has no column.
COLUMNS = {"rmsnorm": "RMSNorm", "prmsnorm": "RMSNorm", "layernorm": "LayerNorm"}


def _study_norm(study_yaml: Path) -> str:
    """The norm a study ran when model.norm is no arm field: its overrides', else its config's."""
    from study.studyfile import load_study
    from training.config import Config, load_config

    if not study_yaml.is_file():
        return Config().model.norm
    study = load_study(study_yaml)
    norm = ((study.get("overrides") or {}).get("model") or {}).get("norm")
    return str(norm or load_config(study["config"]).model.norm)


def _arm_norm(report: dict, label: str, default: str) -> str:
    """The norm an arm ran: its model.norm field where that is an arm field, else the study's."""
    keys = report.get("arm_keys") or []
    if "model.norm" in keys and len(label.split("/")) == len(keys):
        return _fields(label, keys)["model.norm"]
    named = [part for part in label.split("/") if part in COLUMNS]  # a report without arm_keys
    return named[0] if named and not keys else default


def _lr50(fit: dict) -> str:
    """An arm's LR50 with its CI where report.json marks it identified, else its bracket."""
    if fit.get("identified") and fit.get("lr50") is not None:
        return f"LR50 {g(fit['lr50'])} ({interval(fit['ci'])})"
    lo, hi = fit.get("bounds") or [None, None]
    if lo and hi:
        return f"{g(lo)} < LR50 < {g(hi)}"
    return f"LR50 > {g(lo)}" if lo else (f"LR50 < {g(hi)}" if hi else "LR50 not bounded")


def _at_best(gap: list) -> bool:
    """Whether a common_loss claim's gap entry [arm, best LR, common / best, nats] puts the common
    LR at the arm's best (above it as well as below it is a distance the reader is told)."""
    return gap[2] is None or abs(gap[2] - 1) < 0.01


def _measured(report: dict, c: dict, label: str) -> str:
    """One arm's own number for a claim: its LR50 or bracket, LR sensitivity, or its loss's LR."""
    arm = (report.get("per_arm") or {}).get(label) or {}
    if c["metric"] == "lr50":
        return _lr50(arm) if arm else "no fit"
    if c["metric"] == "lr_sensitivity":
        s = arm.get("sensitivity")
        if not s or s.get("mean") is None:
            return "no sensitivity"
        ci = f" ({s['ci'][0]:.2f}..{s['ci'][1]:.2f})" if s.get("ci") else ""
        return f"sensitivity {s['mean']:.2f} nats{ci}"
    lrs = c.get("lrs") or [None, None]
    lr = lrs[0 if label == c["A"] else 1]
    if lr is None:
        return "no common LR"
    gap = next((gp for gp in c.get("gaps") or [] if gp[0] == label), None)
    if c["metric"] == "best_loss" or not gap or _at_best(gap):
        return f"lr {g(lr)} (its best)"
    above = f", +{gap[3]:.2f} nats" if gap[3] is not None else ""
    return f"lr {g(lr)} (x{g(gap[2])} its best{above})"


def _key(c: dict) -> str:
    """A claim's key number: its ratio or difference, a bracket where no ratio is identified."""
    if c.get("agreement") == "running":
        return "running"
    if "lr50_ratio" in c:
        r = c["lr50_ratio"]
        if r.get("identified") and r.get("ratio") is not None:
            return f"ratio {g(r['ratio'])}"
        inner = bracket_text(r.get("bounds") or [None, None]).removesuffix(" (brackets only)")
        return f"ratio {inner} (bracket)"
    p = c["loss"]
    return "no seed where both trained" if p["mean"] is None else f"{p['mean']:+.3f} nats"


def _context(c: dict, report: dict) -> str:
    """What a claim's arms share but the norm: 'post' for rmsnorm/post vs layernorm/post."""
    keys = report.get("arm_keys") or []
    a, b = c["A"].split("/"), c["B"].split("/")
    if len(a) != len(keys) or len(b) != len(keys):  # no arm_keys: drop any part naming a norm
        return "/".join(part for part in _common(c).split("/") if part not in COLUMNS)
    return "/".join(x for k, x, y in zip(keys, a, b, strict=True) if x == y and k != "model.norm")


def norm_cells(cs: list[dict], report: dict, study_norm: str) -> dict[str, str]:
    """A row's RMSNorm and LayerNorm cells, each entry named by its sub-test ('—' where none).

    A claim between the two norms gives each norm its own arm's number; a claim within one norm (a
    placement or qk-norm test's block norm) gives that norm its verdict and key number; a claim of a
    study that ran one norm gives that norm both arms' numbers.
    """
    cells: dict[str, list[str]] = {"RMSNorm": [], "LayerNorm": []}
    many = len(cs) > 1
    for c in cs:
        na, nb = (_arm_norm(report, c[x], study_norm) for x in ("A", "B"))
        ca, cb = COLUMNS.get(na), COLUMNS.get(nb)
        if ca and cb and ca != cb:  # the two norms compared: each its own number
            where = f"{_context(c, report)}: " if many else ""
            cells[ca].append(where + _measured(report, c, c["A"]))
            cells[cb].append(where + _measured(report, c, c["B"]))
        elif ca and ca == cb and na == nb and na in c["A"].split("/"):
            where = _context(c, report)  # the block norm of this sub-test
            cells[ca].append(f"{where + ': ' if where else ''}{c['agreement']}, {_key(c)}")
        elif ca and ca == cb:  # one norm (or two of one family) ran: both arms' numbers
            da, db = _difference(c)
            cells[ca].append(
                f"{da}: {_measured(report, c, c['A'])}; {db}: {_measured(report, c, c['B'])}"
            )
    return {k: "; ".join(v) if v else "—" for k, v in cells.items()}


def _difference(c: dict) -> tuple[str, str]:
    """What tells a claim's two arms apart: the label parts they do not share."""
    a, b = c["A"].split("/"), c["B"].split("/")
    if len(a) != len(b):
        return c["A"], c["B"]
    da = "/".join(x for x, y in zip(a, b, strict=True) if x != y)
    db = "/".join(y for x, y in zip(a, b, strict=True) if x != y)
    return da or c["A"], db or c["B"]


def at_longest(report: dict) -> dict:
    """A report whose arms differ in their budget (train.steps) as read at its longest budgets:
    each claim (metric, expectation, arms) at the longest budget it was asked at, each arm at its
    longest, labels without the budget; any other report unchanged. Budgets whose stages are still
    running (an interim report) are passed over while a finished one is there."""
    steps = sorted({steps_of(c["A"]) for c in report.get("claims", []) if c.get("A")} - {None})
    if len(steps) < 2:
        return report
    done = [s for s in steps if not _running(report, s)] or steps
    claims: dict = {}
    for c in report["claims"]:
        if not c.get("A") or steps_of(c["A"]) not in done:
            continue
        key = (c["metric"], c["expect"], bare(c["A"]), bare(c["B"]))
        if key not in claims or steps_of(c["A"]) > steps_of(claims[key]["A"]):
            claims[key] = c
    arms: dict = {}
    for label in report.get("per_arm", {}):
        if steps_of(label) not in done:
            continue
        if bare(label) not in arms or steps_of(label) > steps_of(arms[bare(label)]):
            arms[bare(label)] = label
    return {
        **report,
        "claims": [
            {
                **c,
                "A": bare(c["A"]),
                "B": bare(c["B"]),
                **({"gaps": [[bare(gp[0]), *gp[1:]] for gp in c["gaps"]]} if c.get("gaps") else {}),
            }
            for c in claims.values()
        ],
        "per_arm": {name: report["per_arm"][label] for name, label in arms.items()},
        "arm_keys": [
            k for k in report.get("arm_keys", []) if k not in (BUDGET, "optim.schedule_steps")
        ],
    }


def _running(report: dict, steps) -> bool:
    """Whether a budget's protocol stages are still running (report.json's running)."""
    running = report.get("running") or {}
    return "all" in running or any(float(b) == steps for b in running)


def _per_token(report: dict, steps: int) -> str | None:
    """Tokens per non-embedding parameter at a budget of `steps` (report.json's budgets)."""
    b = next((b for b in report.get("budgets", []) if b["steps"] == steps), None)
    return b.get("per_non_embedding") if b else None


def budget_sentence(report: dict) -> str | None:
    """Where a study asked its claims at several finished budgets: which verdicts change with the
    budget (each with its verdict at every budget; the others hold), and which budgets are still
    running; None for one budget."""
    by: dict = {}
    for c in report.get("claims", []):
        if c.get("A") and steps_of(c["A"]) is not None:
            key = (c["metric"], c["expect"], bare(c["A"]), bare(c["B"]))
            by.setdefault(key, {})[steps_of(c["A"])] = c
    asked = sorted({s for at in by.values() for s in at})
    steps = [s for s in asked if not _running(report, s)]
    unfinished = {int(float(b)) for b in report.get("running") or {} if b != "all"}
    later = sorted({s for s in asked if _running(report, s)} | unfinished)
    if len(steps) == 1 and later:
        per = _per_token(report, steps[0])
        return (
            f"**By budget**: the sentences above and the table read the {steps[0]}-step runs"
            + (f" ({per} tokens per non-embedding parameter)" if per else "")
            + f"; at {' and '.join(map(str, later))} steps the study is still running."
        )
    if len(steps) < 2:
        return None
    holds, changes = [], []
    for (metric, _expect, a, b), at in by.items():
        what = f"{WORDS.get(metric, metric)}, {a} vs {b}"
        verdicts = [at[s]["agreement"] if s in at else "not run" for s in steps]
        if len(set(verdicts)) == 1 and all(s in at for s in steps):
            holds.append(what)
        else:
            changes.append(
                f"{what} ("
                + ", ".join(f"{v} at {s}" for s, v in zip(steps, verdicts, strict=True))
                + ")"
            )
    budgets = ", ".join(str(s) for s in steps[:-1]) + f" and {steps[-1]}"
    pers = [_per_token(report, s) for s in steps]
    notes = []
    if None not in pers:
        notes.append(f"{', '.join(pers[:-1])} and {pers[-1]} tokens per non-embedding parameter")
    if later:
        notes.append(f"{' and '.join(map(str, later))} still running")
    out = (
        f"**By budget**: asked at {budgets} steps"
        + (f" ({'; '.join(notes)})" if notes else "")
        + f"; the sentences above read the {steps[-1]}-step runs. "
    )
    if not changes:
        return out + f"Every verdict holds at every budget ({len(holds)})."
    return (
        out
        + f"These change with the budget: {'; '.join(changes)}"
        + (f"; the other {len(holds)} hold at every budget." if holds else "; none holds.")
    )


def found(results: Path, rel: str) -> str:
    """The README's "What it found": three generated sentences (placement, norm, qk-norm), the
    verdict counts, the default study's stability map, then the table of questions.yaml (question |
    RMSNorm | LayerNorm | effect and CI | verdict per sub-test | study)."""
    from omegaconf import OmegaConf

    reports = {
        p.parent.name: json.loads(p.read_text()) for p in sorted(results.glob("*/report.json"))
    }
    default = at_longest(reports["norm-placement-lr"])
    claims = [c for c in default["claims"] if c.get("A")]
    place = [
        c for c in claims if c["metric"] == "lr50" and c["A"].split("/")[0] == c["B"].split("/")[0]
    ]
    norm = [c for c in claims if c["A"].split("/")[-1] == c["B"].split("/")[-1]]
    lines = [headline_placement(place)] if place else []
    if norm:
        lines.append(headline_norm(norm, default))
    budget = budget_sentence(reports["norm-placement-lr"])
    if budget:
        lines.append(budget)
    counts: dict[str, int] = {}
    for r in reports.values():
        for c in r.get("claims", []):
            counts[c["agreement"]] = counts.get(c["agreement"], 0) + 1
        counts["withdrawn"] = counts.get("withdrawn", 0) + len(r.get("withdrawn", []))
    corpora = sorted({_corpus(p.parent / "study.yaml") for p in results.glob("*/report.json")})
    where = "one corpus" if len(corpora) == 1 else f"{len(corpora)} corpora ({', '.join(corpora)})"
    lines.append(
        f"{len(reports)} studies, {sum(counts.values())} claims of the literature ("
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        + f"), on 0.1-2M-parameter models "
        f"trained for minutes on {where}: what these settings show, no more."
    )
    if (results / "norm-placement-lr" / "stability_map.png").is_file():
        lines.append(
            "![The default study's stability map: every run's outcome by LR, each arm's failure "
            "curve]"
            f"({rel}/norm-placement-lr/stability_map.png)"
        )
    rows = [
        "| question | RMSNorm | LayerNorm | effect and 95% CI | verdict | study |",
        "|---|---|---|---|---|---|",
    ]
    for q in OmegaConf.to_container(OmegaConf.load(results / "questions.yaml")):
        r = reports.get(q["study"])
        r = at_longest(r) if r is not None else None
        if r is None:
            raise ValueError(f"questions.yaml names study {q['study']!r}, which has no report.json")
        cs = _matching(r, q["claims"])
        if not cs:
            raise ValueError(f"questions.yaml: no claim of {q['study']} matches {q['claims']}")
        page = r.get("page") or ("decision.md" if r.get("decided_from") else "report.md")
        cols = norm_cells(cs, r, _study_norm(results / q["study"] / "study.yaml"))
        effect = "; ".join((f"{_common(c)}: " if len(cs) > 1 else "") + _short(c) for c in cs)
        rows.append(
            f"| {q['question']} | {cols['RMSNorm']} | {cols['LayerNorm']} | {effect} | "
            f"{_cell(cs)} | [{q['study']}]({rel}/{q['study']}/{page}) |"
        )
    return "\n\n".join(lines) + "\n\n" + "\n".join(rows) + "\n"


EXPECT = {
    ("lr50", "higher"): "a higher LR50",
    ("lr50", "lower"): "a lower LR50",
    ("lr_sensitivity", "higher"): "a higher LR sensitivity",
    ("lr_sensitivity", "lower"): "a lower LR sensitivity",
    ("best_loss", "lower"): "a lower loss at its best LR",
    ("best_loss", "higher"): "a higher loss at its best LR",
    ("common_loss", "lower"): "a lower loss at a common LR",
    ("common_loss", "higher"): "a higher loss at a common LR",
}


def _fields(label: str, keys: list[str]) -> dict:
    """An arm label ('layernorm/dim=32/qk_norm=none') as {field: value}, in the report's arm_keys
    order."""
    return {k: part.split("=", 1)[-1] for k, part in zip(keys, label.split("/"), strict=True)}


def _expect(c: dict, report: dict) -> str:
    if c["expect"] == "same":
        sm = report.get("sensitivity_margin", 0.1)
        within = {
            "lr50": f"x{report.get('ratio_margin', 2):g}",
            "lr_sensitivity": f"{sm:g} nats",
        }.get(c["metric"], f"{report.get('margin', 0.02):g} nats")
        return f"the same {WORDS[c['metric']]} (within {within})"
    return EXPECT.get((c["metric"], c["expect"]), f"{c['expect']} {WORDS[c['metric']]}")


def by_norm_sentence(report: dict, link: str) -> str:
    """One sentence on a study's claims that were tested under both block norms (model.norm an arm
    field): per intervention (what the claim's arms differ in) and context, the verdict and numbers
    under each norm; first, how many of the tests asked of both norms the block norm changed the
    verdict of."""
    keys = report["arm_keys"]
    groups: dict = {}
    for c in report.get("claims", []):
        if not c.get("A") or "model.norm" not in keys:
            continue
        a, b = _fields(c["A"], keys), _fields(c["B"], keys)
        diff = [k for k in keys if a[k] != b[k]]
        if "model.norm" in diff:
            continue
        what = " ".join(f"{k.rsplit('.', 1)[-1]}={a[k]} (vs {b[k]})" for k in diff)
        ctx = ", ".join(
            f"{k.rsplit('.', 1)[-1]}={a[k]}" for k in keys if k not in diff and k != "model.norm"
        )
        groups.setdefault((what, _expect(c, report)), {}).setdefault(ctx, {})[a["model.norm"]] = c
    asked = [per for g_ in groups.values() for per in g_.values() if len(per) > 1]
    changed = sum(len({c["agreement"] for c in per.values()}) > 1 for per in asked)
    clauses = []
    for (what, expect), by_ctx in groups.items():
        parts = []
        for ctx, per in by_ctx.items():
            at = f" at {ctx}" if ctx else ""
            if len({c["agreement"] for c in per.values()}) == 1:
                parts.append(
                    f"{next(iter(per.values()))['agreement']}{at} ("
                    + "; ".join(f"{norm}: {_short(c)}" for norm, c in sorted(per.items()))
                    + ")"
                )
            else:
                parts.append(
                    at.strip()
                    + ", "
                    + ", ".join(
                        f"{c['agreement']} under {norm} ({_short(c)})"
                        for norm, c in sorted(per.items())
                    )
                )
        clauses.append(f"{what}, {expect}: " + ", and ".join(parts))
    slopes = [t for t in report.get("trends", []) if t["what"] == "LR sensitivity" and t["ci"]]
    if slopes:
        clauses.append(
            f"LR sensitivity per doubling of {slopes[0]['axis'].rsplit('.', 1)[-1]} ("
            + f"{min(t['points'][0][0] for t in slopes):g}.."
            + f"{max(t['points'][-1][0] for t in slopes):g}"
            + " only): "
            + "; ".join(
                f"{t['pair']}: {t['slope']:+.3f} nats (" + f"{t['ci'][0]:+.3f}..{t['ci'][1]:+.3f})"
                for t in slopes
            )
        )
    sens = [
        (g_[0], ctx, norm, c)
        for g_, by_ctx in groups.items()
        for ctx, per in by_ctx.items()
        for norm, c in sorted(per.items())
        if c.get("own_l_star")
    ]
    moved = [
        (what, ctx, norm, c)
        for what, ctx, norm, c in sens
        if c["own_l_star"]["agreement"] != c["agreement"]
    ]
    if moved:
        clauses.append(
            f"with L* each arm's own best (Wortsman et al.'s definition) {len(moved)} of the "
            f"{len(sens)} "
            "LR-sensitivity verdicts change ("
            + "; ".join(
                f"{what}{' at ' + ctx if ctx else ''} under {norm}: {c['agreement']} -> "
                f"{c['own_l_star']['agreement']} ({c['own_l_star']['estimate']:+.3f} nats, Holm p "
                "= "
                f"{c['own_l_star']['p_holm']:.2g})"
                for what, ctx, norm, c in moved
            )
            + ")"
        )
    if not asked:
        lead = "no claim was tested under both block norms"
    else:
        lead = (
            f"RMSNorm and LayerNorm blocks got the same verdict in {len(asked) - changed} of "
            f"{len(asked)} tests "
            "asked of both"
            + (
                " (a different verdict is not a shown difference between the norms: no test here "
                "compares them)"
                if changed
                else ""
            )
        )
    papers = list(dict.fromkeys(c["paper"] for c in report.get("claims", []) if c.get("A")))
    papers = [
        p for p in papers if not p.startswith("normlab")
    ] or papers  # normlab's own questions are asides
    return f"[{report['name']}]({link}) ({'; '.join(papers)}): {lead}: " + "; ".join(clauses) + "."


def by_norm(paths: list[Path], rels: list[str]) -> str:
    """The body of a `<!-- bynorm: A,B -->` block: one sentence per result folder (its
    report.json)."""
    out = []
    for path, rel in zip(paths, rels, strict=True):
        report = json.loads((path / "report.json").read_text())
        page = report.get("page") or ("decision.md" if report.get("decided_from") else "report.md")
        out.append(by_norm_sentence(report, f"{rel.rstrip('/')}/{page}"))
    return "\n\n".join(out) + "\n"


def bits_per_nat(study_yaml: Path) -> float:
    """The factor that turns a study's val loss (nats per token) into bits per byte: its fixed eval
    set's target tokens over the UTF-8 bytes they encode, over ln 2 (the same tokens at every eval,
    so one constant per study). Read from the study's report.json where its runs logged val/bpb;
    else counted on the prepared data (preparing it if need be)."""
    report = study_yaml.parent / "report.json"
    if report.is_file():
        measured = json.loads(report.read_text()).get("bits_per_nat")
        if measured:
            return float(measured)
    return counted_bits_per_nat(study_yaml)


def counted_bits_per_nat(study_yaml: Path) -> float:
    """bits_per_nat counted on the study's prepared eval set (its base config and overrides)."""
    from omegaconf import OmegaConf

    from study.studyfile import flatten, load_study
    from training.config import load_config

    study = load_study(study_yaml)
    overrides = OmegaConf.to_container(OmegaConf.create(study.get("overrides") or {}))
    return eval_bits_per_nat(load_config(study["config"], flatten(overrides)))


def eval_bits_per_nat(cfg) -> float:
    """A training config's eval set, counted: its target tokens / the UTF-8 bytes they encode /
    ln 2 (the evals' fixed val tokens: train.eval_tokens of them, in seq_len rows)."""
    import math

    import numpy as np

    from data.loader import load_tokens
    from data.prepare import prepare
    from data.tokenizer import Tokenizer

    prepared = prepare(**vars(cfg.data), verbose=False)
    tokens = load_tokens(prepared, "val")
    seq, budget = cfg.train.seq_len, cfg.train.eval_tokens
    n = (
        (len(tokens) - 1) // seq
        if budget <= 0
        else min(max(1, budget // seq), (len(tokens) - 1) // seq)
    )
    targets = np.asarray(tokens[1 : n * seq + 1], dtype=np.int64)
    n_bytes = int(Tokenizer(prepared / "tokenizer.model").token_bytes()[targets].sum())
    return len(targets) / n_bytes / math.log(2)


def _corpus(study_yaml: Path) -> str:
    """The data.source a committed study ran on (its `overrides`, else its base config's, else the
    default)."""
    from study.studyfile import load_study
    from training.config import Config, load_config

    if not study_yaml.is_file():  # a report without a study file (init-grads): the default corpus
        return Config().data.source
    study = load_study(study_yaml)
    source = ((study.get("overrides") or {}).get("data") or {}).get("source")
    return str(source or load_config(study["config"]).data.source)


def replication(paths: str) -> str:
    """Two reports of one study on two corpora side by side (`<!-- replication: A,B -->`): per
    placement, each norm's LR50 (or its bound) and LR sensitivity, the loss at the common safe LR in
    bits per byte, each claim's verdict; then one sentence: which findings hold on both corpora,
    which on one only."""
    folders = [Path(p) for p in paths.split(",")]
    reports = [json.loads((f / "report.json").read_text()) for f in folders]
    factors = [bits_per_nat(f / "study.yaml") for f in folders]
    names = [f.name for f in folders]
    asked = [{(c["A"], c["B"], c["metric"]) for c in r["claims"] if c.get("A")} for r in reports]
    if not set.intersection(*asked):
        return (
            f"The reports ask no claim in common: {' and '.join(names)} were run on different "
            "designs (a study file redesigned and not yet rerun on both corpora); the side by side "
            "waits for both runs of one design.\n"
        )
    rows = ["| claim | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    keyed = []
    for c in reports[0]["claims"]:
        others = [
            next(
                (
                    o
                    for o in r["claims"]
                    if (o["A"], o["B"], o["metric"], o["says"])
                    == (c["A"], c["B"], c["metric"], c["says"])
                ),
                None,
            )
            for r in reports
        ]
        cells = []
        for o, k in zip(others, factors, strict=True):
            if o is None:
                cells.append("-")
            elif o["metric"] == "common_loss" and (o.get("loss") or {}).get("mean") is not None:
                p = o["loss"]
                ci = f" ({p['ci'][0] * k:+.4f}..{p['ci'][1] * k:+.4f})" if p["ci"] else ""
                lr = f" at lr {g(o['lrs'][0])}" if o.get("lrs") else ""
                cells.append(
                    f"**{o['agreement']}**: {p['mean'] * k:+.4f} bpb{ci}, n = {p['n']}{lr}"
                )
            elif o["agreement"] == "running":
                cells.append("running")
            else:
                cells.append(f"**{o['agreement']}**: {_short(o)}")
        if all(o is None or o["agreement"] == "running" for o in others):
            continue  # asked at a budget neither corpus has finished
        keyed.append((c, [o["agreement"] if o else None for o in others]))
        rows.append(
            f"| {c['A']} vs {c['B']}: {WORDS.get(c['metric'], c['metric'])} ({c['expect']}) | "
            + " | ".join(cells)
            + " |"
        )
    arms = [
        "",
        "| arm | " + " | ".join(f"{n}: LR50; LR sensitivity (bits per byte)" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in reports[0]["per_arm"]:
        steps = steps_of(label)
        if steps is not None and any(_running(r, steps) for r in reports):
            continue  # an arm of a budget still running: its fit is of part of its runs
        cells = []
        for r, k in zip(reports, factors, strict=True):
            a = r["per_arm"].get(label) or {}
            s = a.get("sensitivity") or {}
            sens = (
                "-"
                if s.get("mean") is None
                else f"{s['mean'] * k:.3f}"
                + (f" ({s['ci'][0] * k:.3f}..{s['ci'][1] * k:.3f})" if s.get("ci") else "")
            )
            cells.append(f"{a.get('text', '-')}; {sens}")
        arms.append(f"| {label} | " + " | ".join(cells) + " |")
    both = [
        f"{c['A']} vs {c['B']} ({WORDS.get(c['metric'], c['metric'])}: {v[0]})"
        for c, v in keyed
        if len(set(v)) == 1 and v[0] in ("agrees", "disagrees")
    ]
    one = [
        f"{c['A']} vs {c['B']} ({WORDS.get(c['metric'], c['metric'])}: "
        + " / ".join(str(x) for x in v)
        + ")"
        for c, v in keyed
        if len(set(v)) > 1 and None not in v and "running" not in v
    ]
    sentence = (
        "Holds on both corpora: "
        + ("; ".join(both) or "no verdict")
        + ". On one only: "
        + ("; ".join(one) or "none")
        + ". A claim neither corpus decides, or one still running, is in neither list."
    )
    note = (
        "Losses in bits per byte (nats per token x the eval set's tokens / bytes / ln 2: "
        f"{factors[0]:.4f} and "
        f"{factors[1]:.4f} bits per byte per nat), so the two corpora and their tokenizers compare."
    )
    return "\n".join([sentence, "", note, "", *rows, *arms]) + "\n"


def bench(path: Path) -> str:
    """A saved benchmark output, its headings demoted below the page's own."""
    return re.sub(r"^(#+) ", r"#\1 ", path.read_text(), flags=re.M).rstrip("\n") + "\n"


def claim_line(study: str, c: dict) -> str:
    """One claim's result as the report decided it: paper, claim, verdict, with the estimate, CI, n
    and p."""
    if c.get("A") is None:
        head = f"**{study}**, {c['paper']}: {c['says']} ({c['metric']})"
        return f"{head}: **{c['agreement']}** (no arms match it)"
    if "lr50_ratio" in c:
        what = f"LR50 {c['A']} / {c['B']} = {ratio_text(c['lr50_ratio'])}"
    else:
        what = f"{c['A']} - {c['B']} = {loss_text(c['loss'])}"
    p = f", Holm-adjusted p = {c['p_holm']:.2g}" if c.get("p_holm") is not None else ""
    return (
        f"**{study}**, {c['paper']}: {c['says']} ({c['metric']}): **{c['agreement']}** ({what}{p})"
    )


def claim_lines(report_json: Path) -> list[str]:
    """A study's claims, one short line per claim of the study file (its verdict, number and n per
    arm pair), then the ones it withdrew, with why."""
    r = json.loads(report_json.read_text())
    groups: dict[tuple, list[dict]] = {}
    for c in r.get("claims", []):
        groups.setdefault((c["paper"], c["says"]), []).append(c)
    out = []
    for (paper, says), cs in groups.items():
        tested = [c for c in cs if c.get("A")]
        if not tested:
            out.append(f"{says} ({paper}): **not run**")
            continue
        parts = [
            (f"{_common(c)}: " if len(tested) > 1 else "") + f"**{c['agreement']}**, {_short(c)}"
            for c in tested
        ]
        out.append(f"{says} ({paper}): " + "; ".join(parts))
    return out + [
        f"{w['says']} ({w['paper']}): **withdrawn**: {w['why']}" for w in r.get("withdrawn", [])
    ]


def claims(results: Path) -> str:
    """Every study's claims, one line each (the body of a `<!-- claims: FOLDER -->` block)."""
    lines = [
        f"- {line}" for path in sorted(results.glob("*/report.json")) for line in claim_lines(path)
    ]
    return "\n".join(lines) + "\n"


def trend_lines(report_json: Path) -> list[str]:
    """A study's trends as its report fitted them (study/trend.py Trend.describe)."""
    from study.trend import Trend

    return [
        Trend(
            t["what"],
            t["pair"],
            t["axis"],
            t["per_doubling"],
            [(x, e, tuple(ci) if ci else None) for x, e, ci in t["points"]],
            t["slope"],
            tuple(t["ci"]) if t["ci"] else None,
            t["used"],
        ).describe()
        for t in json.loads(report_json.read_text()).get("trends", [])
    ]


def trends(results: Path, rel: str) -> str:
    """Every study's trends, one line each, linking its figure (the body of a `<!-- trends: FOLDER
    -->` block; `rel` is FOLDER as the page names it)."""
    lines = [
        f"- **{path.parent.name}** ([figure]({rel}/{path.parent.name}/"
        f"{'lr_sensitivity' if line.startswith('LR sensitivity') else 'trend'}.png)): {line}"
        for path in sorted(results.glob("*/report.json"))
        for line in trend_lines(path)
    ]
    return "\n".join(lines) + "\n"


def about(folder: Path) -> str | None:
    """What a study asks: the `about:` of the study file kept beside its results (equal to its
    config)."""
    from omegaconf import OmegaConf

    path = folder / "study.yaml"
    return OmegaConf.load(path).get("about") if path.is_file() else None


BY_NORM = (
    "attention-logits",
    "lr-sensitivity-width",
)  # the studies that ask one claim under both block norms


def index(results: Path) -> str:
    """docs/results/README.md: one line per study (a folder with report.json): what it asks, its
    size and wall time, and how its claims came out."""
    lines = [
        "# Results",
        "",
        "Every committed study, one line each (generated by scripts/readme_results.py from "
        "each folder's report.json; the report.md beside it has the numbers, figures and every "
        "run).",
        "",
    ]
    for path in sorted(results.glob("*/report.json")):
        r = json.loads(path.read_text())
        counts = {}
        for c in r.get("claims", []):
            counts[c["agreement"]] = counts.get(c["agreement"], 0) + 1
        if r.get("withdrawn"):
            counts["withdrawn"] = len(r["withdrawn"])
        claims = (
            ("; claims: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
            if counts
            else ""
        )
        size = (
            f"{r['runs']} runs"
            + (f" of {r['steps']} steps" if r.get("steps") else "")
            + (f", {r['wall_min']} min" if r.get("wall_min") else "")
        )
        page = r.get("page") or ("decision.md" if r.get("decided_from") else "report.md")
        again = "; decided again from its archived runs" if r.get("decided_from") else ""
        lines.append(
            f"- [{path.parent.name}]({path.parent.name}/{page}): {about(path.parent) or r['name']} "
            f"({size}{claims}{again})"
        )
        lines += [f"  - {line}" for line in claim_lines(path)]
        lines += [f"  - trend: {line}" for line in trend_lines(path)]
    both = [p.parent for p in sorted(results.glob("*/report.json")) if p.parent.name in BY_NORM]
    if both:
        lines += [
            "",
            "## The instabilities, by block norm",
            "",
            "Wortsman et al. 2023's small-scale instabilities asked under RMSNorm and under "
            "LayerNorm blocks, "
            "one generated sentence per study (each test's n, CI and Holm p in its report).",
            "",
            by_norm(both, [p.name for p in both]).rstrip("\n"),
        ]
    return "\n".join(lines) + "\n"


def update(readme: Path) -> int:
    text = readme.read_text()
    blocks = list(BLOCK.finditer(text))
    if not blocks:
        raise ValueError(
            f"{readme} has no generated block (<!-- found|claims|trends|bench: PATH --> ... "
            f"<!-- /KIND -->)"
        )
    for m in reversed(blocks):
        path = Path(
            os.path.abspath(readme.parent / m.group("path").split(",")[0])
        )  # not resolved: links stay
        if not path.exists():  # page-relative
            raise ValueError(
                f"{readme}: the {m.group('kind')} block names {m.group('path')}, which does not "
                "exist"
            )
        kind = m.group("kind")
        if kind == "bynorm":
            rels = m.group("path").split(",")
            body = by_norm([Path(os.path.abspath(readme.parent / r)) for r in rels], rels)
        elif kind == "replication":
            body = replication(
                ",".join(
                    str(Path(os.path.abspath(readme.parent / p)))
                    for p in m.group("path").split(",")
                )
            )
        elif kind == "found":
            body = found(path, m.group("path").rstrip("/"))
        elif kind == "trends":
            body = trends(path, m.group("path").rstrip("/"))
        else:
            body = {"claims": claims, "bench": bench}[kind](path)
        text = text[: m.start("body")] + body + text[m.end("body") :]
    readme.write_text(text)
    return len(blocks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--readme",
        type=Path,
        nargs="+",
        default=[
            REPO / "README.md",
            REPO / "docs" / "performance.md",
            REPO / "docs" / "results" / "replication.md",
        ],
        help="the pages whose generated blocks to rewrite",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=REPO / "docs" / "results",
        help="folder of the study reports",
    )
    a = p.parse_args(argv)
    for page in a.readme:
        try:
            n = update(page)
        except (ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{page}: {n} generated block(s) written")
    if a.results.is_dir():
        (a.results / "README.md").write_text(index(a.results))
        print(f"{a.results / 'README.md'}: index written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
