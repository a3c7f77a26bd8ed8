"""The committed critical-LR studies judged again under instability in fact speed-free (issue 76's
pre-registered alternative; their files and histories untouched): per placement, what the runs at
each seed's edge (its smallest failing LR under the study's own rule) were, under that rule and
under the speed-free one, and where an arm has no unstable run at all in its grid.

    python -m lab.analyses.speed_free [--save lab/results/speed-free.md]

The speed-free rule (docs/METHODS.md): a run is unstable when its loss or gradient is non-finite,
when it blows up (an eval 0.5 nats above its best so far, or above L0), or when it collapses to a
flat loss that persists after the LR has decayed (the final eval within 0.25 nats of the unigram
entropy, or above it, and its last half not falling 0.01 nats per 10% of the budget). A run still
falling at its end is slow, never failed."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

from lab.archive import archived_runs
from lab.lr50 import lr50_ratio
from lab.multiples import kind_of
from lab.read import group_arms, judge
from lab.studyfile import read_study_file
from training.rundir import write_text

REPO = Path(__file__).resolve().parents[2]
STUDIES = ("critical-lr", "critical-lr-pystdlib", "critical-lr-control", "centring")


def speed_free(rule):
    """The study's rule with the amendment (above_unigram) off: instability in fact speed-free."""
    return dataclasses.replace(rule, name="speed-free", speed_free=True, above_unigram=False)


def edges(name: str) -> dict:
    """One study: per placement, the kinds of its edge runs under both rules, and per arm the
    largest LR with no unstable run under the speed-free rule."""
    folder = REPO / "lab" / "results" / name
    path = REPO / "lab" / "studies" / f"{name}.yaml"
    file = read_study_file(path)
    runs = archived_runs(folder, path)
    seeds = set(file.protocol.critical.seeds) if file.protocol and file.protocol.critical else None
    keys, grouped = group_arms(runs)
    old = {}
    judge(runs, file.rule)
    for r in runs:
        old[id(r)] = (r.why is not None, r.kind, kind_of(r))
    judge(runs, speed_free(file.rule))
    out = {"study": name, "rule": file.rule.describe(), "placements": {}, "arms": {}}
    for label, rs in grouped.items():
        placement = rs[0].config.get("model.placement", "pre")
        cell = out["placements"].setdefault(
            placement, {"edge_runs": 0, "old": Counter(), "new": Counter(), "arms": 0}
        )
        cell["arms"] += 1
        by_seed: dict = {}
        for r in rs:
            if r.finished and (seeds is None or r.seed in seeds):
                by_seed.setdefault(r.seed, []).append(r)
        for seed_runs in by_seed.values():
            failing = [r for r in seed_runs if old[id(r)][0]]
            if not failing:
                continue
            edge = min(failing, key=lambda r: r.lr)
            cell["edge_runs"] += 1
            cell["old"][old[id(edge)][1] or "?"] += 1
            cell["new"][kind_of(edge)] += 1
        unstable = [r.lr for r in rs if r.finished and r.why is not None]
        tested = [r.lr for r in rs if r.finished]
        steps = rs[0].config.get("train.steps")
        out["arms"][label] = {
            "placement": placement,
            "lowest_unstable_lr": min(unstable) if unstable else None,
            "largest_lr": max(tested) if tested else None,
            "unstable_runs": len(unstable),
            "runs": len(tested),
            "steps": steps,
        }
    for cell in out["placements"].values():
        cell["old"], cell["new"] = dict(cell["old"]), dict(cell["new"])
    out["ratios"] = ratios(grouped, old)
    return out


def _curve(runs, failed) -> tuple[list, list]:
    """(lrs, failed) of finished runs; failed(run) None: the run is censored, left out."""
    pairs = [(r.lr, failed(r)) for r in runs if r.finished]
    pairs = [(lr, f) for lr, f in pairs if f is not None]
    return [lr for lr, _ in pairs], [f for _, f in pairs]


def ratios(grouped: dict, old: dict) -> list[dict]:
    """RMSNorm's LR50 over LayerNorm's, arms alike in every other field, under the study's own rule
    and under the speed-free rule (slow runs censored: neither failed nor trained)."""
    out = []
    for label, rs in grouped.items():
        if not label.startswith("rmsnorm"):
            continue
        twin = "layernorm" + label[len("rmsnorm") :]
        if twin not in grouped:
            continue
        row = {"a": label, "b": twin}
        for name, failed in (
            ("own", lambda r: old[id(r)][0]),
            ("speed-free", lambda r: None if kind_of(r) == "slow" else r.why is not None),
        ):
            fit = lr50_ratio(*_curve(rs, failed), *_curve(grouped[twin], failed))
            row[name] = {
                "ratio": fit.ratio,
                "ci": list(fit.ci) if fit.ci else None,
                "identified": fit.identified,
                "text": fit.describe(),
            }
        out.append(row)
    return out


def render(results: list[dict]) -> str:
    lines = [
        "# Edges judged again, instability in fact speed-free",
        "",
        "Generated by `python -m lab.analyses.speed_free` from the committed runs.json files; the "
        "studies' files, histories and reports are untouched. An edge run is a seed's smallest "
        "failing LR under the study's own rule (its critical LR). Kinds under that rule are "
        "lab/read.py's failure kinds; under the speed-free rule (docs/METHODS.md) a run is "
        "unstable (collapsed, blew up, non-finite), slow (not failed: still falling at its end) "
        "or trained.",
        "",
        "| study | placement | edge runs | under its own rule | under the speed-free rule |",
        "|---|---|---|---|---|",
    ]
    for res in results:
        for placement, c in sorted(res["placements"].items()):
            old = ", ".join(f"{v} {k}" for k, v in sorted(c["old"].items()))
            new = ", ".join(f"{v} {k}" for k, v in sorted(c["new"].items()))
            lines.append(f"| {res['study']} | {placement} | {c['edge_runs']} | {old} | {new} |")
    lines += [
        "",
        "RMSNorm's LR50 over LayerNorm's (the arms alike in every other field; Firth logistic fits "
        "with one slope, 95% profile CI): under each study's own rule, and under the speed-free "
        "rule with slow runs censored.",
        "",
        "| study | RMSNorm arm | own rule | speed-free |",
        "|---|---|---|---|",
    ]
    for res in results:
        for row in res["ratios"]:
            lines.append(
                f"| {res['study']} | {row['a']} | {row['own']['text']} | "
                f"{row['speed-free']['text']} |"
            )
    lines += [
        "",
        "Per arm, under the speed-free rule: the lowest LR with an unstable run, or none up to "
        "the largest LR tested.",
        "",
        "| study | arm | steps | unstable runs / runs | lowest unstable LR | largest LR tested |",
        "|---|---|---|---|---|---|",
    ]
    for res in results:
        for label, a in sorted(res["arms"].items()):
            low = a["lowest_unstable_lr"]
            shown = f"{low:.3g}" if low is not None else f"none up to {a['largest_lr']:.3g}"
            lines.append(
                f"| {res['study']} | {label} | {a['steps']} | {a['unstable_runs']} / {a['runs']} "
                f"| {shown} | {a['largest_lr']:.3g} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--save", type=Path, default=None, help="write the tables (and .json) here")
    p.add_argument("studies", nargs="*", default=list(STUDIES))
    a = p.parse_args(argv)
    results = [edges(name) for name in a.studies]
    text = render(results)
    print(text)
    if a.save:
        write_text(a.save, text)
        write_text(a.save.with_suffix(".json"), json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
