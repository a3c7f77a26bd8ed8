"""The results index, lab/results/README.md, generated from every committed report.json (never by
hand): per study its question, its size and one row per pre-registered claim, paired critical-LR
finding or pair at a multiple of the best LR. The index knows no study by name; the README's
findings are prose a person writes, each number checked against its report.json by
tests/test_findings.py.

    python -m lab.readme      # lab/results/README.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from lab.text import BUDGET, bare, g, interval, rank_shift, steps_of
from training import errors
from training.rundir import read_json, write_text

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "lab" / "results"
AGAIN = "decided-again.yaml"  # in the results folder: an older claim a later study decides again


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
    if c.get("rank"):  # a failed run kept in its pair: the rank test decided
        return rank_shift(c["rank"]) + ", failed runs kept as the worst outcome"
    return (nats(c.get("loss")) + " nats") if _paired(c) else "-"


def n_of(c: dict) -> str:
    if "lr50_ratio" in c:
        return f"{c['lr50_ratio'].get('n', '-')} runs"
    if c.get("rank"):
        return f"{c['rank']['n']} seeds"
    return f"{c['loss']['n']} seeds" if _paired(c) else "-"


def _paired(c: dict) -> bool:
    """Whether a loss claim compared any pair (not one left undecided by its LR rule)."""
    return bool(c.get("loss") and c["loss"].get("n"))


def estimate(c: dict) -> str:
    """A claim's estimate and n, or, where it compared nothing, why (e.g. no common LR)."""
    if "lr50_ratio" in c or _paired(c):
        return f"{effect(c)}, {n_of(c)}"
    return c.get("how") or "nothing compared"


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
        lines += again_lines(name, read.get("claims", []), results)
        lines += critical_rows(r)
        lines += multiples_rows(r)
        for w in r.get("withdrawn", []):
            lines.append(f"\n- withdrawn: {w['says']} ({w['paper']}): {w['why']}")
    return "\n".join(lines) + "\n"


def decided_again(results: Path) -> list[dict]:
    """The results folder's decided-again.yaml: entries {old, new, says, why}, each an older
    study's claim (by its words) that a later study file decides again; [] where there is none."""
    path = results / AGAIN
    if not path.is_file():
        return []
    import yaml

    entries = yaml.safe_load(path.read_text()) or []
    for e in entries:
        missing = {"old", "new", "says", "why"} - set(e)
        if missing:
            raise errors.BadInput(f"{path}: an entry lacks {sorted(missing)}: {e}")
    return entries


def claim_of(results: Path, study: str, says: str) -> dict | None:
    """A study's reported claim with these words, read at its longest budget; None before its
    report exists."""
    path = results / study / "report.json"
    if not path.is_file():
        return None
    found = [c for c in at_longest(read_json(path)).get("claims", []) if c["says"] == says]
    if not found:
        raise errors.BadInput(f"{results / AGAIN}: {study} reports no claim '{says}'")
    return found[0]


def again_lines(name: str, claims: list[dict], results: Path) -> list[str]:
    """Under a study's claims: which of them a later study decided again, and which verdict
    stands (the later one, its LR chosen so that the choice cannot decide it); under the later
    study, what the older one said."""
    out = []
    for e in decided_again(results):
        if e["old"] == name:
            new = claim_of(results, e["new"], e["says"])
            if new is None:
                out.append(
                    f"- '{e['says']}' is being decided again in {e['new']} ({e['why']}); its runs "
                    "have not finished, and until they do this verdict is not to be relied on."
                )
            else:
                out.append(
                    f"- '{e['says']}' was decided again in [{e['new']}]({e['new']}/report.md) "
                    f"({e['why']}): **{new['agreement']}**, {estimate(new)}. That "
                    "verdict stands; this one does not."
                )
        elif e["new"] == name and any(c["says"] == e["says"] for c in claims):
            old = claim_of(results, e["old"], e["says"])
            out.append(
                f"- '{e['says']}' decides again [{e['old']}]({e['old']}/report.md)'s claim, "
                f"which said **{old['agreement']}** ({effect(old)}): this verdict stands."
            )
    return [""] + out if out else []


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


def multiples_rows(report: dict) -> list[str]:
    """A multiples study's tested and control pairs (report.json's `multiples`), one row per pair
    and factor: the verdict, the difference (or, with unstable runs, its median) and its n."""
    rows = [p for p in (report.get("multiples") or {}).get("pairs", []) if p["role"] != "check"]
    if not rows:
        return outcome_rows(report)
    out = [
        "",
        "At multiples of each arm's best LR (a - b in nats, paired by seed; Holm over the tests):",
        "",
        "| pair | role | x best LR | verdict | a - b (95% CI) | spread over identical | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in rows:
        if p.get("mean") is not None and p.get("ci"):
            est = f"{p['mean']:+.3f} ({interval(p['ci'], '+.3f')})"
        else:
            est = f"median {p['median']:+.3f}" if p.get("median") is not None else "-"
        s = p.get("spread") or {}
        spread = (
            f"x{s['ratio']:.2f} ({s['ci'][0]:.2f}-{s['ci'][1]:.2f}): {s['verdict']}"
            if s.get("ratio") is not None
            else "-"
        )
        out.append(
            f"| {p['pair']} | {p['role']} | {p['factor']:g} | **{p['verdict']}** | {est} | "
            f"{spread} | {p['n']} |"
        )
    return out


def outcome_rows(report: dict) -> list[str]:
    """A multiples study without pairs: each arm's runs at each factor by kind (unstable, slow,
    trained) and their median final loss."""
    rows = (report.get("multiples") or {}).get("outcomes", [])
    if not rows:
        return []
    out = [
        "",
        "At multiples of each arm's best LR (runs by kind; slow: still falling at the end, never "
        "failed):",
        "",
        "| arm | x best LR | LR | runs | unstable | slow | trained | median final |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in rows:
        arm = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in o["arm"].items())
        kinds = {k: v for k, v in o["kinds"].items() if k not in ("slow", "trained")}
        unstable = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) or "0"
        out.append(
            f"| {arm} | {o['factor']:g} | {o['lr']:.3g} | {o['n']} | {unstable} | "
            f"{o['kinds'].get('slow', 0)} | {o['kinds'].get('trained', 0)} | "
            f"{o['median_final']:.3f} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m lab.readme; every error one line and its code (training/errors.py)."""
    return errors.run(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = errors.Parser(prog="python -m lab.readme", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    if not a.results.is_dir():
        raise errors.BadInput(f"{a.results} is not a folder")
    write_text(a.results / "README.md", index(a.results))  # a full disk: the path that failed
    print(f"{a.results / 'README.md'}: index written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
