"""The sentences a report states, each generated from the numbers of a StudyResult: a difference or
an equivalence only ever with its n, its CI and the test that decided it; failed runs as outcomes,
never as values."""

from __future__ import annotations

import math
import statistics

from lab import critical
from lab.arms import Arm, max_series, mean_of
from lab.result import StudyResult


def findings(res: StudyResult) -> list[str]:
    out = []
    sel = ", ".join(map(str, res.selection_seeds))
    for c in res.comparisons:
        out.append(
            f"{c.a.label} over {c.b.label} (differ in {c.key}), stability: {c.ratio.describe()}."
        )
        n = c.loss
        if not res.test_seeds:  # one seed: it chose each arm's LR, none is left to compare them
            out.append(
                f"{c.a.label} - {c.b.label}: no loss comparison (no test seed: seed {sel} chose "
                "each arm's LR; a study with more seeds tests on the others)."
            )
            continue
        if n.lrs is None:
            out.append(
                f"{c.a.label} - {c.b.label}: no loss comparison (an arm has no LR where every "
                "selection seed trained)."
            )
            continue
        line = (
            f"{c.a.label} - {c.b.label}, each at its best LR ({n.lrs[0]:g}, {n.lrs[1]:g}; chosen "
            f"on seeds {sel}), final val loss on the test seeds: {n.paired.describe()}"
        )
        if n.dropped:
            line += f"; left out (a run failed): {', '.join(n.dropped)}"
        out.append(line + ".")
    for a in res.arms.values():  # a best LR at the end of the LRs tried is a bound, not an optimum
        tried = sorted({r.lr for r in a.runs if r.seed in res.selection_seeds})
        if a.best_lr is not None and len(tried) > 1 and a.best_lr in (tried[0], tried[-1]):
            side = "lowest" if a.best_lr == tried[0] else "highest"
            out.append(
                f"**{a.label}**: its best LR ({a.best_lr:g}) is the {side} its selection seeds "
                "tried: not bracketed, the loss at its true best may be lower (a protocol study "
                "extends the grid)."
            )
    for a in res.arms.values():  # failures under the study's rule, as outcomes
        failed = [r for r in a.runs if r.failed]
        if failed:
            lrs = sorted({r.lr for r in failed})
            slow = len(a.slow())
            out.append(
                f"**{a.label}**: {len(failed)} of {len(a.runs)} runs failed under the study's "
                f"rule (at lr {', '.join(f'{x:g}' for x in lrs)})"
                + (
                    f"; {slow} of them below its floor, too slow to learn within the budget"
                    if slow
                    else ""
                )
                + "."
            )
    for a in res.arms.values():  # split outcomes at one LR: said seed by seed, never averaged
        for lr in a.lrs:
            rs = [r for r in a.at(lr) if r.finished]
            if any(r.failed for r in rs) and any(r.trained for r in rs):
                out.append(
                    f"**{a.label}** at lr {lr:g} splits: "
                    + ", ".join(
                        f"seed {r.seed} "
                        + (f"trained {r.final:.3f}" if r.trained else f"failed ({r.why})")
                        for r in sorted(rs, key=lambda r: str(r.seed))
                    )
                    + "; no mean is taken across them."
                )
    logit = {
        a.label: [max_series(r, "attn/logit_max/") for r in a.at(max(a.lrs))]
        for a in res.arms.values()
    }
    logit = {k: [x for x in v if x is not None] for k, v in logit.items()}
    logit = {k: v for k, v in logit.items() if v}
    if len(logit) > 1:
        out.append(
            "Max attention logit at each arm's highest LR, per seed: "
            + "; ".join(f"{k} " + ", ".join(f"{x:.1f}" for x in v) for k, v in logit.items())
            + "."
        )
    return out + norm_input_findings(res.arms, res.keys) + critical.findings(res)


def margin_in_steps(res: StudyResult) -> str | None:
    """What the equivalence margin means in training: the steps it takes, at the end of the runs of
    each common_loss claim's LR, for the val loss to fall by the margin (the slope between the last
    two evals, mean over the runs that trained)."""
    out = []
    for c in res.claims:
        if c.nested is None or c.claim["metric"] != "common_loss" or not c.nested.lrs:
            continue
        lr = c.nested.lrs[0]
        slopes, at = [], None
        for label in (c.a, c.b):
            for r in res.arms[label].at(lr):
                evals = [
                    (e["step"], e["val/loss"]) for e in r.records if e.get("val/loss") is not None
                ]
                if r.trained and len(evals) >= 2 and evals[-1][0] > evals[-2][0]:
                    (s0, v0), (s1, v1) = evals[-2], evals[-1]
                    slopes.append((v1 - v0) / (s1 - s0))
                    at = (s0, s1)
        fall = -statistics.fmean(slopes) if slopes else 0.0
        if fall > 0:
            out.append(
                f"{c.a} vs {c.b} at lr {lr:g}: the val loss falls {fall:.2g} nats per step "
                f"between steps {at[0]} and {at[1]}, so +-{res.margin:g} nats is ~"
                f"{res.margin / fall:.0f} steps of training"
            )
    return "; ".join(out) or None


def margin_sentence(res: StudyResult) -> str:
    """The equivalence margin, why, what it means in training, and what it costs in seeds at these
    spreads."""
    reason = (
        f" ({res.file.margin_reason})"
        if res.file.margin_reason
        else " (the default; the study file gives no reason)"
    )
    steps = margin_in_steps(res)
    if steps:
        reason += f". In training: {steps}"
    needed = [
        (c.a.label, c.b.label, c.loss.needed, c.loss.paired.n)
        for c in res.comparisons
        if c.loss.paired.ci is not None
    ]
    text = f"Equivalence margin +-{res.margin:g} nats{reason}."
    if needed:
        text += (
            " At the spread of the nested differences, TOST at this margin needs for 80% power: "
            + "; ".join(
                f"{a} vs {b} {'> 100,000' if k is None else k} seeds (have {n})"
                for a, b, k, n in needed
            )
            + "; where the study has fewer, its numbers are an estimate with a CI, not an "
            "equivalence verdict."
        )
    return text


def _layer_mean(run, prefix: str, step: int) -> float | None:
    rec = next((r for r in run.records if r.get("step") == step), {})
    vals = [v for k, v in rec.items() if k.startswith(prefix) and v is not None]
    return sum(vals) / len(vals) if vals else None


def norm_input_findings(arms: dict[str, Arm], keys: list[str]) -> list[str]:
    """What the block norms receive, per arm at its best LR (mean over seeds): |per-token mean| /
    RMS averaged over layers at the first and last logged step (what LayerNorm's centring removes);
    and, when the arms differ in precision, the largest |input| seen (float16's x^2 overflows above
    256) and float16's skipped steps."""
    out, ratio, absmax, skipped, energy = [], [], [], [], []
    for a in arms.values():
        runs = a.at(a.best_lr) if a.best_lr is not None else []
        ends = [energy_ends(run) for run in runs]
        ends = [e for e in ends if e is not None]
        if ends:
            energy.append(
                f"{a.label} {mean_of([e[0] for e in ends]):.4f} -> "
                f"{mean_of([e[1] for e in ends]):.4f}"
            )
        steps = [[r["step"] for r in run.records if "norm_in/rms/layer_0" in r] for run in runs]
        pairs = []
        for run, st in zip(runs, steps, strict=True):
            if st:
                ends = [
                    (_layer_mean(run, "norm_in/mean/", s), _layer_mean(run, "norm_in/rms/", s))
                    for s in (st[0], st[-1])
                ]
                if all(m is not None and r for m, r in ends):
                    pairs.append([m / r for m, r in ends])
        if pairs:
            ratio.append(
                f"{a.label} {mean_of([x[0] for x in pairs]):.2f} -> "
                f"{mean_of([x[1] for x in pairs]):.2f}"
            )
        m = _max_series_all(a.runs, "norm_in/absmax/")
        if m is not None:
            absmax.append(f"{a.label} {m:.1f}")
        sk = [
            sum(r.get("amp/skipped", 0) for r in run.records)
            for run in a.runs
            if any("amp/skipped" in r for r in run.records)
        ]
        if sk:
            skipped.append(
                f"{a.label} {sum(sk):.0f} of {sum(len(series_steps(run)) for run in a.runs)}"
            )
    if ratio:
        dims = sorted(
            {d for a in arms.values() if isinstance(d := a.runs[0].config.get("model.dim"), int)}
        )
        chance = (
            ""
            if not dims
            else f"; {(2 / (math.pi * dims[0])) ** 0.5:.2f} is chance, E|mean| / RMS of zero-mean "
            f"{dims[0]}-d vectors"
            if len(dims) == 1
            else "; chance, E|mean| / RMS of zero-mean d-dim vectors, is "
            + ", ".join(f"{(2 / (math.pi * d)) ** 0.5:.2f} at d = {d}" for d in dims)
        )
        out.append(
            "Block norms' inputs, |per-token mean| / RMS averaged over layers, first -> last "
            "logged step (at "
            f"each arm's best lr, mean over seeds{chance}): " + "; ".join(ratio) + "."
        )
    if energy:
        out.append(
            "Block norms' inputs, mean-energy fraction mean(x)^2 / mean(x^2) averaged over layers, "
            "first -> last stats step (at each arm's best lr, mean over seeds; about 1/d without a "
            "systematic mean; the part of the input LayerNorm removes and RMSNorm keeps): "
            + "; ".join(energy)
            + "."
        )
    if absmax and {"train.dtype", "model.norm_precision"} & set(keys):
        out.append(
            "Largest |norm input| over every logged step, layer and run (float16's x^2 overflows "
            "above "
            "256): " + "; ".join(absmax) + "."
        )
    if skipped:
        out.append(
            "Optimizer steps skipped by the float16 loss scaler (overflowed gradients), of all "
            "steps: " + "; ".join(skipped) + "."
        )
    return out


def energy_ends(run) -> tuple[float, float] | None:
    """A run's mean-energy fraction averaged over layers at its first and last stats step."""
    steps = [r["step"] for r in run.records if "norm_in/mean_energy/layer_0" in r]
    if not steps:
        return None
    means = []
    for s in (steps[0], steps[-1]):
        rec = next(r for r in run.records if r.get("step") == s)
        vals = [
            v
            for k, v in rec.items()
            if k.startswith("norm_in/mean_energy/layer_") and k[26:].isdigit() and v is not None
        ]
        means.append(sum(vals) / len(vals))
    return means[0], means[1]


def _max_series_all(runs, prefix: str) -> float | None:
    vals = [v for run in runs if (v := max_series(run, prefix)) is not None]
    return max(vals) if vals else None


def series_steps(run) -> list[int]:
    return [r["step"] for r in run.records if "train/loss" in r]
