"""A study's result as files: report.json (every number the pages print, and more) and runs.json
(every run's config, outcome and val curve, so the study can be decided again without its run
directories: lab/archive.py)."""

from __future__ import annotations

import copy
from pathlib import Path

from lab import centring, critical, multiples
from lab.history import history
from lab.paired import paired
from lab.result import StudyResult
from lab.text import BUDGET, lr50_cell


def multiples_json(res) -> dict:
    """{"multiples": {"outcomes", "pairs"}} for a study with a multiples: section, else {}."""
    spec = res.file.multiples
    if spec is None:
        return {}
    return {
        "multiples": {
            "factors": list(spec.factors),
            "chosen": spec.chosen,
            "outcomes": multiples.outcomes(res.runs, spec, res.keys),
            "pairs": multiples.compare(res.runs, spec, res.margin),
        }
    }


def budgets(path: Path | None) -> list[dict]:
    """Each distinct budget of the study's arms, shortest first: steps, tokens, and tokens per
    parameter, all parameters and non-embedding ones (Kaplan et al. 2020's N), with the ranges of
    both counts over the arms; [] without a file. Counted once per version of the file."""
    if path is None:
        return []
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _COUNTED:
        _COUNTED[key] = _budgets(path)
    return copy.deepcopy(_COUNTED[key])


_COUNTED: dict = {}


def _budgets(path: Path) -> list[dict]:
    import train
    from lab.studyfile import arm_configs, load_study

    seen: dict = {}
    for cfg in arm_configs(load_study(path)):
        about, t = train.describe(cfg), cfg.train
        tokens = t.steps * t.batch_size * t.seq_len
        total, blocks = about["parameters"], about["non_embedding_parameters"]
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


def budgets_text(runs) -> str:
    """Every budget of the runs, in steps: '300' or, along a steps axis, '300/1000/3000'."""
    return "/".join(
        str(s) for s in sorted({int(r.config[BUDGET]) for r in runs if r.config.get(BUDGET)})
    )


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


def outcome_pairs(res: StudyResult, a: str | None, b: str | None) -> dict | None:
    """How often the two arms' runs of one (LR, seed) had the same outcome (both failed or both
    trained) under the study's rule: {n, same}. Arms that differ only in the norm share each seed's
    data order and all other initial weights, so this says how far the seed decides the outcome."""
    if a not in res.arms or b not in res.arms:
        return None
    outcome = lambda arm: {(r.lr, r.seed): r.failed for r in res.arms[arm].runs if r.finished}
    x, y = outcome(a), outcome(b)
    both = set(x) & set(y)
    return {"n": len(both), "same": sum(x[k] == y[k] for k in both)}


def paired_json(p) -> dict:
    return {
        "n": p.n,
        "mean": p.mean,
        "ci": list(p.ci) if p.ci else None,
        "verdict": p.verdict,
        "mde": p.mde,
        "p": p.p_diff,
        "p_tost": p.p_tost,
    }


def sensitivity_json(res: StudyResult, a: str, b: str) -> dict | None:
    """A's per-seed LR sensitivity - B's (L* each one's own best), paired by seed, at the study's
    sensitivity margin: what the README's sensitivity row reads where no claim asks for it."""
    sa, sb = res.sensitivity.get(a), res.sensitivity.get(b)
    if sa is None or sb is None:
        return None
    return paired_json(paired(sa.per_seed, sb.per_seed, res.file.sensitivity_margin))


def as_json(res: StudyResult) -> dict:
    """report.json: what the README, the index and a later decision read."""

    pj = paired_json

    def rj(r):
        return {
            "ratio": r.ratio if r.identified else None,
            "ci": list(r.ci) if r.identified and r.ci else None,
            "level": r.level,  # the CI's confidence: 1 - alpha / looks after adaptive stopping
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
        **multiples_json(res),  # loss at multiples of the best LR (lab/multiples.py)
        "critical": critical.comparisons(res),  # paired critical LRs (lab/critical.py)
        "centring": centring.rows(res),  # RMSNorm / LayerNorm per regime (lab/centring.py)
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
                "sensitivity": sensitivity_json(res, c.a.label, c.b.label),
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
                        **({"rank": c.nested.rank} if c.nested.rank else {}),
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
                **({"outcome_pairs": outcome_pairs(res, c.a, c.b)} if c.ratio else {}),
            }
            for c in res.claims
        ],
        "withdrawn": res.file.withdrawn,
        "designs": [
            {k: d.get(k) for k in ("hash", "since", "changed", "why", "runs")} for d in res.designs
        ],
        "history": history(res.file.name, res.file.history),
        "builds": res.builds,
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
    judge and decide again (lab/archive.py) without the run directories."""
    return [
        {
            "name": r.name,
            "config": {k: r.config.get(k) for k in (*res.keys, *KEPT)},
            "summary": {k: r.summary.get(k) for k in SUMMARY},
            "val": [[e["step"], e["val/loss"]] for e in r.records if e.get("val/loss") is not None],
        }
        for r in sorted(res.runs, key=lambda r: r.name)
    ]
