"""The README's answer and the results index, generated from the committed report.json files (never
by hand, never from data: rendering reads only lab/results/).

    python -m lab.readme      # README.md's found block, lab/results/README.md

The README's block is three sentences (the norm's answer, the placement finding, what these settings
are), the default study's stability map and one table of at most six rows, one number and its 95% CI
per cell. Every other study's verdicts are the index's, one row per claim.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from lab.studyfile import flatten, load_study
from lab.text import BUDGET, bare, g, interval, steps_of
from training import errors
from training.config import load_config
from training.rundir import read_json, write_text

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "lab" / "results"
DEFAULT, REPLICATION = "norm-placement-lr", "norm-placement-lr-pystdlib"
CRITICAL = "critical-lr"  # paired per-seed critical LRs (issue 60): the answer once it has them
CONTROL = "critical-lr-control"  # its negative control, a known x1.3 LR factor
CRITICAL_REPLICATION = "critical-lr-pystdlib"  # critical-lr on the standard library's source
CENTRING, CENTRING_WIDTH = "centring", "centring-width"  # where centring matters (issue 60)
BLOCK = re.compile(r"(<!-- found: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /found -->)", re.S)
PLACEMENTS = {"post": "post-norm", "pre": "pre-norm"}
NAMES = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}


def fields(label: str, keys: list[str]) -> dict[str, str]:
    """An arm label ('layernorm/post/steps=300') as {field: value}, in report.json's arm_keys
    order."""
    parts = label.split("/")
    return {k: p.split("=", 1)[-1] for k, p in zip(keys, parts, strict=True)}


def at_longest(report: dict) -> dict:
    """The report read at its longest finished budget: each claim (metric, expectation, arms) and
    each arm at the longest budget it was asked at, labels without the budget; a report without a
    budget axis unchanged."""
    steps = sorted({steps_of(c["A"]) for c in report.get("claims", []) if c.get("A")} - {None})
    if len(steps) < 2:
        return report
    running = report.get("running") or {}
    done = [s for s in steps if "all" not in running and all(float(b) != s for b in running)]
    done = done or steps
    claims: dict = {}
    for c in report["claims"]:
        if c.get("A") and steps_of(c["A"]) in done:
            key = (c["metric"], c["expect"], bare(c["A"]), bare(c["B"]))
            if key not in claims or steps_of(c["A"]) > steps_of(claims[key]["A"]):
                claims[key] = c
    arms: dict = {}
    for label in report.get("per_arm", {}):
        if steps_of(label) in done:
            if bare(label) not in arms or steps_of(label) > steps_of(arms[bare(label)]):
                arms[bare(label)] = label
    longest = max(steps_of(c["A"]) for c in claims.values())
    return {
        **report,
        "claims": [{**c, "A": bare(c["A"]), "B": bare(c["B"])} for c in claims.values()],
        "per_arm": {name: report["per_arm"][label] for name, label in arms.items()},
        "arm_keys": [k for k in report["arm_keys"] if k not in (BUDGET, "optim.schedule_steps")],
        "read_at": longest,
    }


def ci(x: dict | None, key: str) -> str:
    """'1.04 (0.827-1.33)': an identified estimate and its 95% CI, three significant digits;
    'in 0.1-0.316' where only bracketed; '-' where the data do not identify it."""
    if not x:
        return "-"
    if x.get("identified", True) and x.get(key) is not None and x.get("ci"):
        lo, hi = x["ci"]
        return f"{x[key]:#.3g} ({lo:#.3g}-{hi:#.3g})"
    lo, hi = x.get("bounds") or (None, None)
    if lo and hi:
        return f"in {g(lo)}-{g(hi)}"
    return f"> {g(lo)}" if lo else f"< {g(hi)}" if hi else "-"


def confidence(claims: list[dict]) -> str:
    """'95% CI', or the confidence of LR50 intervals widened to their looks ('99.2% CI')."""
    levels = sorted({c["lr50_ratio"].get("level", 0.95) for c in claims if "lr50_ratio" in c})
    if levels in ([], [0.95]):
        return "95% CI"
    return (
        "/".join(f"{100 * v:.3g}%" for v in levels)
        + " CI, 1 - 0.05 / looks after adaptive stopping"
    )


def nats(loss: dict | None) -> str:
    """'+0.010 (-0.033..+0.052)': a paired difference in nats and its 95% CI."""
    if not loss or loss.get("mean") is None:
        return "-"
    return f"{loss['mean']:+.3f} ({interval(loss['ci'], '+.3f')})"


def effect(c: dict) -> str:
    """A claim's estimate: the LR50 ratio or the loss difference, with its 95% CI."""
    if "lr50_ratio" in c:
        level = c["lr50_ratio"].get("level", 0.95)
        wider = "" if level == 0.95 or not c["lr50_ratio"].get("ci") else f", {100 * level:.3g}% CI"
        return "LR50 ratio " + ci(c["lr50_ratio"], "ratio") + wider
    return (nats(c.get("loss")) + " nats") if c.get("loss") else "-"


def n_of(c: dict) -> str:
    if "lr50_ratio" in c:
        return f"{c['lr50_ratio'].get('n', '-')} runs"
    return f"{c['loss']['n']} seeds" if c.get("loss") else "-"


def versus(c: dict, keys: list[str]) -> str:
    """'post vs pre (layernorm, 3000 steps)': what the two arms differ in, then the budget."""
    if not c.get("A"):
        return "no arms match"
    a, b = fields(c["A"], keys), fields(c["B"], keys)
    diff = [k for k in keys if a[k] != b[k]]
    same = [a[k] for k in keys if a[k] == b[k] and k in ("model.norm", "model.placement")]
    budget = f"{a[BUDGET]} steps" if BUDGET in a else ""
    context = ", ".join(same + ([budget] if budget else []))
    head = "/".join(a[k] for k in diff) + " vs " + "/".join(b[k] for k in diff)
    return head + (f" ({context})" if context else "")


def _pick(report: dict, metric: str, expect: str, differ: str) -> dict[str, dict]:
    """The report's claims of `metric` and `expect` whose arms differ in field `differ` only, by
    their other field's value (placement for a norm claim, norm for a placement claim)."""
    keys, out = report["arm_keys"], {}
    for c in report["claims"]:
        if c["metric"] != metric or c["expect"] != expect or not c.get("A"):
            continue
        a, b = fields(c["A"], keys), fields(c["B"], keys)
        if [k for k in keys if a[k] != b[k]] == [differ]:
            other = "model.placement" if differ == "model.norm" else "model.norm"
            out[a[other]] = c
    return out


def _arm(report: dict, norm: str, placement: str) -> dict | None:
    keys = report["arm_keys"]
    for label, arm in report["per_arm"].items():
        f = fields(label, keys)
        if f.get("model.norm") == norm and f.get("model.placement") == placement:
            return arm
    return None


def _with(cs: list[dict]) -> str:
    """'agrees with' / 'disagrees with' / 'cannot tell, asking': how the claims' paper fares."""
    said = {c["agreement"] for c in cs}
    return f"{said.pop()} with" if len(said) == 1 and "cannot tell" not in said else "asking"


def _holm(cs: list[dict]) -> str:
    ps = [c["p_holm"] for c in cs if c.get("p_holm") is not None]
    return ", ".join(f"{p:.2g}" for p in ps)


def norm_sentence(report: dict) -> str:
    """The mission's answer: RMSNorm's LR50 against LayerNorm's per placement, the verdict at the
    study's margin, and why two LR50s can be equal (the runs' outcomes, pair by pair)."""
    same = _pick(report, "lr50", "same", "model.norm")
    if not same:
        return ""
    parts, verdicts = [], []
    for place in PLACEMENTS:
        c = same.get(place)
        if c:
            parts.append(f"x{ci(c['lr50_ratio'], 'ratio')} in {PLACEMENTS[place]}")
            verdicts.append(c["agreement"])
    margin = f"x{report.get('ratio_margin', 2):g}"
    if set(verdicts) == {"agrees"}:
        head = f"**RMSNorm is as stable as LayerNorm** (LR50 within {margin}) in both placements"
    else:
        said = ", ".join(f"{p}: {v}" for p, v in zip(PLACEMENTS.values(), verdicts, strict=False))
        head = f"**Is RMSNorm as stable as LayerNorm (LR50 within {margin})?** {said}"
    cs = [same[p] for p in PLACEMENTS if p in same]
    n = " and ".join(str(c["lr50_ratio"]["n"]) for c in cs)
    running = sorted(float(b) for b in report.get("running") or {} if b != "all")
    later = "".join(f"; {b:g} steps still running" for b in running if b > report.get("read_at", 0))
    out = (
        f"{head}: its LR50 is LayerNorm's {' and '.join(parts)} ({confidence(cs)}; TOST, Holm p "
        f"{_holm(cs)}; {n} runs at {report.get('read_at', '?')} steps{later})."
    )
    for place, c in same.items():
        pairs = c.get("outcome_pairs")
        if pairs and pairs["same"] == pairs["n"] and c["lr50_ratio"].get("ratio") == 1.0:
            out += (
                f" In {PLACEMENTS.get(place, place)} the two LR50s are equal because every seed "
                f"had the same outcome under both norms ({pairs['n']} of {pairs['n']} LR x seed "
                "pairs)."
            )
    return out


def placement_sentence(report: dict) -> str:
    """Post-norm's LR50 against pre-norm's, under each norm."""
    lower = _pick(report, "lr50", "lower", "model.placement")
    if not lower:
        return ""
    parts = [f"x{ci(c['lr50_ratio'], 'ratio')} with {NAMES.get(n, n)}" for n, c in lower.items()]
    verdicts = {c["agreement"] for c in lower.values()}
    head = (
        "**Placement decides stability**"
        if verdicts == {"agrees"}
        else "**Does post-norm fail below pre-norm's LRs?** " + ", ".join(sorted(verdicts))
    )
    return (
        f"{head}: post-norm's LR50 is pre-norm's {' and '.join(parts)} "
        f"({confidence(list(lower.values()))}, Holm p {_holm(list(lower.values()))}): "
        f"{_with(list(lower.values()))} {next(iter(lower.values()))['paper']}."
    )


def settings_sentence(report: dict, study_yaml: Path, replication: dict | None) -> str:
    """What these settings are: model size, budgets in tokens per parameter, corpora."""
    cfg = load_config(*_study_config(study_yaml))
    budgets = report.get("budgets") or []
    params = sorted({p for b in budgets for p in b.get("parameters", [])})
    steps = "/".join(str(b["steps"]) for b in budgets)
    per = "/".join(str(b["per_non_embedding"]) for b in budgets)
    size = f"{params[0] / 1e3:.0f}k" if params and params[0] < 1e6 else f"{params[0] / 1e6:.1f}M"
    corpus = {"pydocs": "Python's documentation", "pystdlib": "its standard library's source"}
    where = corpus.get(cfg.data.source, cfg.data.source)
    again = " and again on its standard library's source" if replication else ""
    return (
        f"**These settings**: {size}-parameter LLaMAs (d {cfg.model.dim}, {cfg.model.n_layers} "
        f"layers) trained on 2 CPU cores for {steps} steps ({per} tokens per non-embedding "
        f"parameter) on {where}{again}: what they show, no more."
    )


ZERO = "model.zero_mean_writers"


def oriented(report: dict | None, key: str, top: str) -> list[tuple[dict, dict]]:
    """report.json's `critical` rows whose arms differ in `key` only, as the arm with `top` over
    the other (ratio and CI inverted where stored the other way), each with its first arm's fields;
    rows that could not be decided are left out."""
    out = []
    for r in (report or {}).get("critical", []):
        if r["key"] != key or "error" in r:
            continue
        a = fields(r["a"], report["arm_keys"])
        if a[key] != top:
            lo, hi = r["ci"]
            r = r | {"ratio": 1 / r["ratio"], "ci": [1 / hi, 1 / lo]}
        out.append((a, r))
    return out


def _norm_pairs(report: dict | None) -> tuple[dict[str, dict], list[dict]]:
    """RMSNorm / LayerNorm by placement, and the zero-mean-writer pairs (the positive control)."""
    rows = oriented(report, "model.norm", "rmsnorm")
    plain = {a["model.placement"]: r for a, r in rows if a.get(ZERO) != "True"}
    return plain, [r for a, r in rows if a.get(ZERO) == "True"]


def _ratio(r: dict, more: str = "") -> str:
    """'x1.02 (0.93-1.12)', or with `more` inside its parentheses: 'x1.02 (0.93-1.12; agrees)'."""
    out = "x" + ci({"ratio": r["ratio"], "ci": r["ci"]}, "ratio")
    return out[:-1] + f"; {more})" if more and out.endswith(")") else out


def _regime_fields(regime: str) -> dict[str, str]:
    """A centring row's regime ('dim=64, n_heads=4') as {field: value}."""
    return dict(kv.split("=", 1) for kv in regime.split(", ") if "=" in kv)


def _regime(regime: str) -> str:
    """A centring row's regime in words: 'no added mean', 'an embedding mean of 0.45', 'linear
    biases', 'd 64'."""
    f = _regime_fields(regime)
    words = []
    if float(f.get("init_embedding_mean", 0)) != 0:
        words.append(f"an embedding mean of {float(f['init_embedding_mean']):g}")
    if f.get("linear_bias") == "True":
        words.append("linear biases")
    if "dim" in f:
        words.append(f"d {f['dim']}")
    return ", ".join(words) or "no added mean"


def centring_sentence(report: dict | None, study_yaml: Path, width: dict | None = None) -> str:
    """Where centring matters (issue 60): per regime of the centring study (and of its width axis,
    where committed) the critical-LR ratio RMSNorm / LayerNorm with its verdict, the loss
    difference at each one's best LR, and the mean-energy fraction each norm's inputs end at; ''
    without the study."""
    rows = (report or {}).get("centring") or []
    if not rows:
        return ""
    cfg = load_config(*_study_config(study_yaml))
    wide = sorted((width or {}).get("centring") or [], key=_width_of)
    ns = sorted({r["n"] for r in rows + wide})
    place = f"{PLACEMENTS[cfg.model.placement]}, " if cfg.model.placement in PLACEMENTS else ""
    parts = [f"{_ratio(r, r['verdict'])} with {_regime(r['regime'])}" for r in rows]
    out = [
        f"**Where the stream carries a mean** ({place}{' / '.join(map(str, ns))} paired seeds): "
        f"RMSNorm's critical LR over LayerNorm's is {', '.join(parts)}."
    ]
    losses = [r["loss"] for r in rows if r.get("loss")]
    ends = [(r["energy_rmsnorm"], r["energy_layernorm"]) for r in rows]
    energy = ""
    if all(a and b for a, b in ends):
        energy = (
            "ending with a mean-energy fraction of "
            + ", ".join(f"{a[1]:.2g}" for a, _ in ends)
            + " against LayerNorm's "
            + ", ".join(f"{b[1]:.2g}" for _, b in ends)
            + f" (1/{cfg.model.dim} by chance)"
        )
    if len(losses) == len(rows):
        cells = [f"{x['mean']:+.3f} ({interval(x['ci'], '+.3f')}; {x['verdict']})" for x in losses]
        n = "/".join(sorted({str(x["n"]) for x in losses}))
        out.append(
            f"At each one's best LR RMSNorm's loss minus LayerNorm's is {', '.join(cells)} nats "
            f"in that order ({n} seeds)" + (f", its norm inputs {energy}." if energy else ".")
        )
    elif energy:
        out.append(f"At the best LR RMSNorm's norm inputs end {energy[len('ending ') :]}.")
    if wide:  # after the regimes' sentences, whose "in that order" it would break
        out.append(_width_sentence(wide, (width or {}).get("budgets") or []))
    # every regime without an added mean (no mean, at each width): its loss equivalent, its
    # critical LR not apart, or centring is not shown dispensable there
    calm = [r for r in rows + wide if re.fullmatch(r"no added mean|d \d+", _regime(r["regime"]))]
    plain = [r.get("loss") for r in rows if _regime(r["regime"]) == "no added mean"]
    worse = [
        _regime(r["regime"])
        for r in rows
        if r.get("loss") and r["loss"]["verdict"] == "different" and r["loss"]["mean"] > 0
    ]
    dispensable = all(
        r.get("loss") and r["loss"]["verdict"] == "equivalent" and r["verdict"] != "differs"
        for r in calm
    )
    if worse and plain and dispensable:
        where = (
            "in loss, not in the critical LR, "
            if all(r["verdict"] != "differs" for r in rows)
            else "in loss "
        )
        out.append(
            f"Centring pays {where}where the stream carries a mean ({', '.join(worse)}), as Jiang "
            "et al. 2023's exact swap implies; without one it is dispensable, as Zhang & Sennrich "
            "2019 found."
        )
    return " ".join(out)


def _width_of(row: dict) -> int:
    """A width-axis row's d (its regime's dim=), for reading the widths in order."""
    return int(_regime_fields(row["regime"]).get("dim", 0))


def _width_sentence(wide: list[dict], budgets: list[dict]) -> str:
    """The width axis of the centring sentence: its budget per width in tokens per non-embedding
    parameter, per width the critical-LR ratio and its verdict, the loss difference at each one's
    best LR where measured, and where each norm's inputs end against the mean-energy fraction of
    chance (1/d)."""
    at = [_regime(r["regime"]) for r in wide]
    # one budget per width: the wider model has more parameters (the rows are in order of d)
    budgets = sorted(budgets, key=lambda b: b["non_embedding_parameters"][0])
    budget = ""
    if len(budgets) == len(wide) and len({b["steps"] for b in budgets}) == 1:
        per = " and ".join(str(b["per_non_embedding"]) for b in budgets)
        budget = f"; {budgets[0]['steps']} steps, {per} tokens per non-embedding parameter"
    out = f"With width (the width init{budget}): " + ", ".join(
        f"{_ratio(r, r['verdict'])} at {where}" for r, where in zip(wide, at, strict=True)
    )
    losses = [r.get("loss") for r in wide]
    if all(losses):
        out += "; loss differences " + ", ".join(
            f"{x['mean']:+.3f} ({interval(x['ci'], '+.3f')}; {x['verdict']})" for x in losses
        )
        out += f" nats ({'/'.join(sorted({str(x['n']) for x in losses}))} seeds)"
    ends = [(r["energy_rmsnorm"], r["energy_layernorm"]) for r in wide]
    dims = [where.split()[-1] for where in at]
    if all(a and b for a, b in ends) and all(d.isdigit() for d in dims):
        out += (
            "; mean-energy fractions "
            + ", ".join(f"{a[1]:.2g} / {b[1]:.2g}" for a, b in ends)
            + f" (RMSNorm / LayerNorm; {', '.join(f'1/{d}' for d in dims)} by chance)"
        )
    return out + "."


def _study_config(study_yaml: Path) -> tuple:
    """A study file's config and overrides, as load_config takes them."""
    study = load_study(study_yaml)
    return study["config"], flatten(study.get("overrides") or {})


def critical_sentence(report: dict, control: dict | None, replication: dict | None = None) -> str:
    """The mission's answer on the paired per-seed critical LR (issue 60): RMSNorm / LayerNorm per
    placement with its verdict at the study's margin, what its seeds rule out, the two controls
    (identical computations must agree, a known LR factor must differ) and the replication on the
    second corpus."""
    plain, zero = _norm_pairs(report)
    if not plain:
        return ""
    places = [p for p in PLACEMENTS if p in plain]
    cs = [plain[p] for p in places]
    margin = f"x{cs[0]['margin']:g}"
    known = [r for a, r in oriented(control, "optim.lr_factor", "1.0") if "known" in r]
    again, again_zero = _norm_pairs(replication)
    # "as stable as" only where the instrument earned "same": its identical pair agrees and its
    # known change differs (each where run), and the other corpus agrees too (where run)
    earned = (
        all(z["verdict"] == "agrees" for z in zero[:1])
        and all(k["verdict"] == "differs" for k in known[:1])
        and all(r["verdict"] == "agrees" for r in again.values())
    )
    if {c["verdict"] for c in cs} == {"agrees"} and earned:
        head = f"**RMSNorm is as stable as LayerNorm** (per-seed critical LR within {margin})"
    else:
        head = f"**RMSNorm against LayerNorm, seed by seed** (critical LR, TOST at {margin})"
    parts = [f"{_ratio(plain[p], plain[p]['verdict'])} in {PLACEMENTS[p]}" for p in places]
    ns = " and ".join(str(c["n"]) for c in cs)
    ps = ", ".join(f"{c['p_tost']:.2g}" for c in cs)
    out = [
        f"{head}: RMSNorm's critical LR is LayerNorm's {' and '.join(parts)} (95% CI, paired over "
        f"{ns} seeds; TOST p {ps})."
    ]
    out.append(
        "These seeds rule out more than "
        + " and ".join(f"x{plain[p]['bound']:.2f} in {PLACEMENTS[p]}" for p in places)
        + " either way."
    )
    checks = [
        "two identical computations (zero-mean writers) "
        + _ratio(z, f"{z['verdict']}, {z['n']} seeds")
        for z in zero[:1]
    ]
    checks += [
        f"a known x{k['known']:g} LR change " + _ratio(k, f"{k['verdict']}, {k['n']} seeds")
        for k in known[:1]
    ]
    if checks:
        out.append(f"The instrument's controls: {' and '.join(checks)}.")
    if again:
        where = [p for p in PLACEMENTS if p in again]
        out.append(
            "On the standard library's source: "
            + " and ".join(
                f"{_ratio(again[p], again[p]['verdict'])} in {PLACEMENTS[p]}" for p in where
            )
            + f" ({' and '.join(str(again[p]['n']) for p in where)} seeds"
            + "".join(
                f"; its identical computations {_ratio(z, z['verdict'])}" for z in again_zero[:1]
            )
            + ")."
        )
    return " ".join(out)


def critical_placement_sentence(report: dict, default: dict) -> str:
    """Post-norm's paired critical LR over pre-norm's under each norm, with the default study's
    placement claim's paper: agrees where every pair differs with its CI below 1."""
    rows = oriented(report, "model.placement", "post")
    cs = {a["model.norm"]: r for a, r in rows if a.get(ZERO) != "True"}
    if not cs:
        return ""
    parts = [f"{_ratio(r)} with {NAMES.get(n, n)}" for n, r in cs.items()]
    below = all(r["verdict"] == "differs" and r["ci"][1] < 1 for r in cs.values())
    papers = {c["paper"] for c in _pick(default, "lr50", "lower", "model.placement").values()}
    said = f": agrees with {papers.pop().rstrip('.')}" if below and len(papers) == 1 else ""
    head = (
        "**Placement decides stability**"
        if below
        else "**Does post-norm fail below pre-norm's LRs?** "
        + ", ".join(sorted({r["verdict"] for r in cs.values()}))
    )
    ns = " and ".join(str(r["n"]) for r in cs.values())
    ps = ", ".join(f"{r['p']:.2g}" for r in cs.values())
    return (
        f"{head}: post-norm's critical LR is pre-norm's {' and '.join(parts)} (95% CI, paired "
        f"over {ns} seeds, t-test p {ps}){said}."
    )


def critical_cells(
    report: dict | None, label: str = "critical LR ratio, RMSNorm / LayerNorm"
) -> tuple[str, list[str]] | None:
    """The critical-LR row: per placement RMSNorm / LayerNorm's paired critical-LR ratio and its
    95% CI, from report.json's `critical` (the pairs that differ only in the norm, without
    zero-mean writers: those are the control); None where it has none."""
    plain, _ = _norm_pairs(report)
    if not plain:
        return None
    cells = {p: ci({"ratio": r["ratio"], "ci": r["ci"]}, "ratio") for p, r in plain.items()}
    ns = [str(plain[p]["n"]) for p in PLACEMENTS if p in plain]
    name = f"{label} (paired, {' / '.join(ns)} seeds)"
    return name, [cells.get(p, "-") for p in PLACEMENTS]


def norm_rows(report: dict, field: str) -> dict[str, dict]:
    """RMSNorm - LayerNorm by placement from report.json's comparisons' `field` ('loss' at each
    one's best LR on the test seeds, 'sensitivity' per seed), at the report's read budget, the
    zero-mean-writer pairs left out."""
    out = {}
    for c in report.get("comparisons", []):
        if (
            c["key"] != "model.norm"
            or not c.get(field)
            or steps_of(c["A"]) != report.get("read_at")
        ):
            continue
        a = fields(bare(c["A"]), report["arm_keys"])
        if a.get(ZERO) == "True" or not c[field].get("ci"):  # a cell is a number and its CI
            continue
        loss = dict(c[field])
        if a["model.norm"] == "layernorm" and loss.get("mean") is not None:  # as RMS - LN
            loss["mean"], loss["ci"] = -loss["mean"], [-x for x in loss["ci"][::-1]]
        out[a["model.placement"]] = {"loss": loss}
    return out


def table(
    report: dict,
    replication: dict | None,
    critical: dict | None = None,
    critical_replication: dict | None = None,
) -> list[str]:
    """At most six rows, one number and its 95% CI per cell, post-norm and pre-norm side by side;
    with critical-lr's paired critical-LR ratios, they lead in place of the two LR50 rows, its
    sensitivity and best-LR rows (more seeds) replace the default study's, and its replication's
    ratios replace the LR50 replication row."""
    same = _pick(report, "lr50", "same", "model.norm")
    rep = _pick(replication, "lr50", "same", "model.norm") if replication else {}
    sens = _pick(report, "lr_sensitivity", "same", "model.norm")
    best = norm_rows(report, "loss")
    crit = critical_cells(critical)
    again = critical_cells(critical_replication, "... on the stdlib source")
    if crit:
        sens = norm_rows(critical, "sensitivity") or sens
        best = norm_rows(critical, "loss") or best
    rows = [
        ("LR50, LayerNorm", [ci(_arm(report, "layernorm", p), "lr50") for p in PLACEMENTS]),
        ("LR50, RMSNorm", [ci(_arm(report, "rmsnorm", p), "lr50") for p in PLACEMENTS]),
        (
            "LR50 ratio, RMSNorm / LayerNorm",
            [ci(same[p]["lr50_ratio"], "ratio") if p in same else "-" for p in PLACEMENTS],
        ),
        (
            "... on the stdlib source",
            [ci(rep[p]["lr50_ratio"], "ratio") if p in rep else "-" for p in PLACEMENTS],
        ),
        (
            f"LR sensitivity, RMSNorm - LayerNorm (nats, {_n(sens)} seeds)",
            [nats(sens[p].get("loss")) if p in sens else "-" for p in PLACEMENTS],
        ),
        (
            f"loss at each one's best LR, RMSNorm - LayerNorm (nats, {_n(best)} seeds)",
            [nats(best[p]["loss"]) if p in best else "-" for p in PLACEMENTS],
        ),
    ]
    if crit:  # the paired ratio replaces the two LR50s it refines: at most six rows
        # and its replication, beneath it, the LR50 replication's row
        again_rows = [again, rows[2]] if again else [rows[2], rows[3]]
        rows = [crit, *again_rows, *rows[4:]]
    rows = [r for r in rows if any(cell != "-" for cell in r[1])]
    out = ["| | post-norm | pre-norm |", "|---|---|---|"]
    out += [f"| {name} | {' | '.join(cells)} |" for name, cells in rows]
    return out


def _n(cs: dict[str, dict]) -> str:
    """'3 / 4': the seeds behind each placement's paired difference."""
    return " / ".join(str((cs[p].get("loss") or {}).get("n", "-")) for p in PLACEMENTS if p in cs)


def counts(reports: dict[str, dict]) -> str:
    tally: dict[str, int] = {}
    for r in reports.values():
        for c in r.get("claims", []):
            tally[c["agreement"]] = tally.get(c["agreement"], 0) + 1
        if r.get("withdrawn"):
            tally["withdrawn"] = tally.get("withdrawn", 0) + len(r["withdrawn"])
    return ", ".join(f"{v} {k}" for k, v in sorted(tally.items()))


def found(results: Path, rel: str) -> str:
    """The README's block: three sentences (four with the centring study), the stability map, the
    table, the index's link."""
    reports = {p.parent.name: read_json(p) for p in sorted(results.glob("*/report.json"))}
    if DEFAULT not in reports:
        raise ValueError(f"{results} has no {DEFAULT}/report.json")
    default = at_longest(reports[DEFAULT])
    rep = at_longest(reports[REPLICATION]) if REPLICATION in reports else None
    crit, control = reports.get(CRITICAL), reports.get(CONTROL)
    crit_rep = reports.get(CRITICAL_REPLICATION)
    sentences = [
        critical_sentence(crit, control, crit_rep)
        if critical_cells(crit)
        else norm_sentence(default),
        (critical_cells(crit) and critical_placement_sentence(crit, default))
        or placement_sentence(default),
    ]
    sentences.append(
        centring_sentence(
            reports.get(CENTRING), results / CENTRING / "study.yaml", reports.get(CENTRING_WIDTH)
        )
    )
    sentences.append(settings_sentence(default, results / DEFAULT / "study.yaml", rep))
    lines = [textwrap.fill(s, 110, break_on_hyphens=False) for s in sentences if s]
    lines.append(
        f"![Every run's outcome by LR and each arm's failure curve P(fail | lr)]"
        f"({rel}/{DEFAULT}/stability_map.png)"
    )
    lines.append("\n".join(table(default, rep, crit, crit_rep)))
    read = reports[DEFAULT]
    ratios = confidence(list(_pick(read, "lr50", "same", "model.norm").values()))
    ratios = "" if ratios == "95% CI" else f", the ratios' {ratios.replace(' CI,', ' CI:', 1)}"
    first = (
        f"Critical LR: a seed's smallest unstable LR under the speed-free rule, bisected, paired "
        f"over seeds, 95% t CI ([report]({rel}/{CRITICAL}/report.md)). "
        if critical_cells(crit)
        else ""
    )
    note = first + (
        f"LR50: the LR at which half the runs fail, a Firth logistic fit over {read['runs']} "
        f"runs{ratios}; differences paired over seeds, 95% t CI "
        f"([report]({rel}/{DEFAULT}/report.md), "
        f"[methods](docs/METHODS.md)). Every study's verdicts ({len(reports)} studies; "
        f"{counts(reports)}): [{rel}/README.md]({rel}/README.md)."
    )
    lines.append(textwrap.fill(note, 110, break_on_hyphens=False, break_long_words=False))
    return "\n\n".join(lines) + "\n"


def index(results: Path) -> str:
    """lab/results/README.md: per study its question, size, one row per claim and one per paired
    critical-LR finding."""
    lines = [
        "# Results",
        "",
        "Every committed study: its question, its size, and one row per pre-registered claim "
        "(verdict, estimate and 95% CI, n, Holm-adjusted p) or paired critical-LR finding, "
        "generated by `python -m lab.readme` "
        "from each folder's report.json. A study asked at several budgets is read at its longest; "
        "its report has every budget, every arm and every run.",
    ]
    for path in sorted(results.glob("*/report.json")):
        r, name = read_json(path), path.parent.name
        page = r.get("page") or ("decision.md" if r.get("decided_from") else "report.md")
        size = f"{r['runs']} runs" + (f" of {r['steps']} steps" if r.get("steps") else "")
        size += f", {r['wall_min']} min" if r.get("wall_min") else ""
        again = "; decided again from its archived runs" if r.get("decided_from") else ""
        current = results.parent / "studies" / f"{name}.yaml"
        copy = path.parent / "study.yaml"
        if current.is_file() and copy.is_file() and current.read_text() != copy.read_text():
            again += f"; an earlier form of studies/{name}.yaml: its present form has not finished"
        lines += [
            "",
            f"## [{name}]({name}/{page})",
            "",
            f"{r.get('about') or name} ({size}{again})",
        ]
        read = at_longest(r)
        if read.get("claims"):
            lines += [
                "",
                "| claim | arms | verdict | estimate (95% CI) | n | Holm p |",
                "|---|---|---|---|---|---|",
            ]
            for c in read["claims"]:
                p = f"{c['p_holm']:.2g}" if c.get("p_holm") is not None else "-"
                lines.append(
                    f"| {c['says']} ({c['paper']}) | {versus(c, read['arm_keys'])} | "
                    f"**{c['agreement']}** | {effect(c)} | {n_of(c)} | {p} |"
                )
        lines += critical_rows(r)
        for w in r.get("withdrawn", []):
            lines.append(f"\n- withdrawn: {w['says']} ({w['paper']}): {w['why']}")
    return "\n".join(lines) + "\n"


def critical_rows(report: dict) -> list[str]:
    """A study's paired critical-LR findings (report.json's `critical`), one row per pair: the
    ratio a / b, its 95% CI, seeds, TOST and t-test p, and the verdict at the study's margin."""
    rows = [r for r in report.get("critical", []) if "error" not in r]
    if not rows:
        return []
    out = [
        "",
        f"Paired critical LRs (TOST at x{rows[0]['margin']:g}; a known factor's pair: its ratio "
        "should be the factor):",
        "",
        "| pair, a / b | differ in | verdict | ratio (95% CI) | seeds | TOST p / t p |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        known = f"; known x{r['known']:g}" if "known" in r else ""
        out.append(
            f"| {r['a']} / {r['b']} | {r['key'].split('.')[-1]}{known} | **{r['verdict']}** | "
            f"{ci({'ratio': r['ratio'], 'ci': r['ci']}, 'ratio')} | {r['n']} | "
            f"{r['p_tost']:.2g} / {r['p']:.2g} |"
        )
    return out


def update(readme: Path, results: Path) -> None:
    text = readme.read_text()
    m = BLOCK.search(text)
    if not m:
        raise ValueError(
            f"{readme} has no generated block (<!-- found: PATH --> ... <!-- /found -->)"
        )
    body = found(results, m.group("path").rstrip("/"))
    write_text(readme, text[: m.start("body")] + body + text[m.end("body") :])


def main(argv: list[str] | None = None) -> int:
    """python -m lab.readme; every error one line and its code (training/errors.py)."""
    return errors.run(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = errors.Parser(prog="python -m lab.readme", description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", type=Path, default=REPO / "README.md")
    p.add_argument("--results", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    for path, kind in ((a.readme, "file"), (a.results, "folder")):
        if not (path.is_file() if kind == "file" else path.is_dir()):
            raise errors.BadInput(f"{path} is not a {kind}")
    update(a.readme, a.results)  # a full disk: the path that failed (README.md or the index)
    write_text(a.results / "README.md", index(a.results))
    print(f"{a.readme}: generated block written; {a.results / 'README.md'}: index written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
