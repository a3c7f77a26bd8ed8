"""Loss at fixed multiples of each arm's best LR (docs/METHODS.md, "Loss at multiples of the best
LR"): a study file's `multiples:` runs each arm at its best LR times each factor on common seeds.

- outcomes: per arm and factor, how many runs trained, were slow (not past the unigram level at
  their end and still falling: never failed) and were unstable, by kind; their median final loss.
- pairs (the file's `compare:`), at each factor, paired by seed:
  (a) the mean of d_s = L_a(s) - L_b(s): where no run of the two arms at that factor is unstable, a
      95% t interval, TOST at the study's margin and a two-sided t test; where one is, an unstable
      run stays in its pair as the worst outcome (worse than any finite loss) and a Wilcoxon
      signed-rank test says whether the arms differ (equivalence is not claimed);
  (b) a test pair's spread against its yardstick's (two identical computations): the ratio of the
      sds of their per-seed differences, its 95% interval from the F distribution; below SD_MARGIN
      "no more than identical", above 1 "more than identical", else "cannot tell";
  and the smallest mean difference the yardstick's spread lets n seeds resolve (80% power).
One Holm family: every test pair's (a) and (b) at every factor (a test the runs cannot make is in it
with p = 1), each p the smaller of its two one-sided decisions doubled."""

from __future__ import annotations

import math
import statistics

from scipy import stats as st

from lab.paired import detectable, holm, paired
from lab.read import Run
from lab.studyfile import Multiples, Pair

SD_MARGIN = 1.5  # a test pair's sd within 1.5x the yardstick's: "no more than identical"


def _arm(run: Run, keys: list[str]) -> tuple:
    return tuple((k, run.config.get(k)) for k in keys)


def _same(x, y) -> bool:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y))
    return float(x) == float(y) if numbers else x == y


def _of(runs: list[Run], arm: tuple) -> list[Run]:
    """The runs whose config has every (field, value) of `arm`."""
    return [r for r in runs if all(_same(r.config.get(k), v) for k, v in arm)]


def factor(run: Run, spec: Multiples) -> float:
    combination = {k: v for k, v in run.config.items() if k not in ("optim.lr", "train.seed")}
    return spec.factor(spec.lr(_matching(spec, combination)), run.lr)


def _matching(spec: Multiples, config: dict) -> dict:
    """The part of a run's config the best_lr entries are written in."""
    fields = {k for f, _ in spec.best_lr for k in f}
    return {k: config.get(k) for k in fields}


def kind_of(run: Run, learn_margin: float = 0.25) -> str:
    """The kind of a failed run's instability; for one that did not fail, slow (it has not learned
    past the unigram level, within `learn_margin` of its entropy or above it, and is still falling
    at its end, or the rule would call it a collapse: censored, never failed) or trained."""
    if run.why is not None:
        return run.kind or "unstable"
    unigram, final = run.summary.get("unigram_entropy"), run.final
    if unigram is not None and final is not None and final > unigram - learn_margin:
        return "slow"
    return "trained"


def outcomes(runs: list[Run], spec: Multiples, keys: list[str]) -> list[dict]:
    """Per arm and factor: n, trained, slow, unstable by kind, and the median final loss of the
    runs that finished without a non-finite loss."""
    cells: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.finished:
            cells.setdefault((_arm(r, keys), factor(r, spec)), []).append(r)
    out = []
    for (arm, f), rs in sorted(cells.items(), key=lambda c: (str(c[0][0]), c[0][1])):
        kinds: dict[str, int] = {}
        for r in rs:
            k = kind_of(r)
            kinds[k] = kinds.get(k, 0) + 1
        finals = [r.final for r in rs if r.final is not None and math.isfinite(r.final)]
        energy = [e for e in map(mean_energy, rs) if e is not None]
        dim = rs[0].config.get("model.dim")
        out.append(
            {
                "arm": dict(arm),
                "factor": f,
                "lr": statistics.median(r.lr for r in rs),
                "n": len(rs),
                "kinds": dict(sorted(kinds.items())),
                "unstable": sum(1 for r in rs if r.why is not None),
                "median_final": statistics.median(finals) if finals else None,
                # what the norms receive at the end: the share of its energy in the mean direction
                # (1 / dim by chance), each run's last logged value over its blocks, 95% t CI
                "mean_energy": _mean_ci(energy),
                "chance": 1 / dim if dim else None,
            }
        )
    return out


def mean_energy(run: Run) -> float | None:
    """The run's last logged norm_in/mean_energy/layer_{i}, averaged over its blocks."""
    for r in reversed(run.records):
        values = [v for k, v in r.items() if k.startswith("norm_in/mean_energy/layer_")
                  and k.count("/") == 2 and v is not None]  # fmt: skip
        if values:
            return statistics.fmean(values)
    return None


def _mean_ci(values: list[float]) -> dict | None:
    if len(values) < 2:
        return None
    m, se = statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))
    t = float(st.t.ppf(0.975, len(values) - 1))
    return {"mean": m, "ci": [m - t * se, m + t * se], "n": len(values)}


def _losses(runs: list[Run], f: float, spec: Multiples) -> dict:
    """{seed: final loss, or inf for an unstable run} of one arm's finished runs at factor f."""
    out = {}
    for r in runs:
        if r.finished and factor(r, spec) == f:
            out[r.seed] = math.inf if r.why is not None else r.final
    return out


def _ranked(a: dict, b: dict) -> dict:
    """Per common seed d = a - b with an unstable run the worst outcome: its loss replaced by one
    above every finite loss of the two arms (two unstable runs tie)."""
    seeds = sorted(set(a) & set(b))
    finite = [v for s in seeds for v in (a[s], b[s]) if math.isfinite(v)]
    worst = (max(finite) if finite else 0.0) + 1.0
    return {s: (worst if a[s] == math.inf else a[s]) - (worst if b[s] == math.inf else b[s])
            for s in seeds}  # fmt: skip


def _sd_ratio(d: list[float], y: list[float]) -> dict:
    """sd(d) / sd(y), its 95% interval and the decision's p (the smaller of the one-sided p's of
    'ratio >= SD_MARGIN' and 'ratio <= 1', doubled)."""
    n1, n2 = len(d) - 1, len(y) - 1
    vd, vy = statistics.variance(d), statistics.variance(y)
    if vy == 0 or vd == 0:
        return {"ratio": None, "ci": None, "p": None, "verdict": "cannot tell"}
    f = vd / vy
    lo = math.sqrt(f / st.f.ppf(0.975, n1, n2))
    hi = math.sqrt(f / st.f.ppf(0.025, n1, n2))
    p_within = float(st.f.cdf(f / SD_MARGIN**2, n1, n2))  # H0: ratio >= SD_MARGIN
    p_more = float(st.f.sf(f, n1, n2))  # H0: ratio <= 1
    p = min(1.0, 2 * min(p_within, p_more))
    verdict = "no more than identical" if hi < SD_MARGIN else "cannot tell"
    verdict = "more than identical" if lo > 1 else verdict
    return {"ratio": math.sqrt(f), "ci": [lo, hi], "p": p, "verdict": verdict}


def compare(runs: list[Run], spec: Multiples, margin: float) -> list[dict]:
    """Each pair of the file's compare: at each factor (module docstring); Holm over the tests."""
    pairs = {p.name: p for p in spec.compare}
    diffs: dict[tuple[str, float], dict] = {}
    out = []
    for p in spec.compare:
        ra, rb = _of(runs, p.a), _of(runs, p.b)
        for f in spec.factors:
            a, b = _losses(ra, f, spec), _losses(rb, f, spec)
            seeds = sorted(set(a) & set(b))
            if not seeds:
                continue
            unstable = sum(1 for s in seeds if math.inf in (a[s], b[s]))
            row = {"pair": p.name, "role": p.role, "factor": f, "n": len(seeds)}
            row["unstable_pairs"] = unstable
            row["unstable"] = [sum(a[s] == math.inf for s in seeds),
                               sum(b[s] == math.inf for s in seeds)]  # fmt: skip
            d = _ranked(a, b)
            if unstable == 0:
                t = paired({s: a[s] for s in seeds}, {s: b[s] for s in seeds}, margin)
                row.update(mean=t.mean, ci=list(t.ci) if t.ci else None, sd=_sd(d))
                row.update(p_tost=t.p_tost, p_t=t.p_diff)
                if t.p_tost is not None and t.p_diff is not None:
                    row["p_mean"] = min(1.0, 2 * min(t.p_tost, t.p_diff))
                    row["decides"] = "tost" if t.p_tost <= t.p_diff else "t"
                diffs[(p.name, f)] = d
            else:
                nonzero = [v for v in d.values() if v != 0]
                p_w = float(st.wilcoxon(nonzero).pvalue) if len(nonzero) >= 2 else 1.0
                row.update(p_wilcoxon=p_w, p_mean=p_w, decides="wilcoxon")
                row["median"] = statistics.median(d.values())
            out.append(row)
    for row in out:  # spreads against the yardstick's, and what the yardstick resolves
        p = pairs[row["pair"]]
        y = diffs.get((p.yardstick, row["factor"])) if p.yardstick else None
        d = diffs.get((row["pair"], row["factor"]))
        if y is not None and len(y) >= 2:
            row["detectable"] = detectable(statistics.stdev(y.values()), row["n"])
        if p.role == "test" and y is not None and d is not None and len(d) > 2 and len(y) > 2:
            row["spread"] = _sd_ratio(list(d.values()), list(y.values()))
    _decide(out, margin)
    return out


def _sd(d: dict) -> float | None:
    return statistics.stdev(d.values()) if len(d) >= 2 else None


def _decide(rows: list[dict], margin: float) -> None:
    """Holm over every test pair's mean and spread decisions; each row's verdicts."""
    # the pre-registered family: every test pair's mean and spread at every factor; a test the runs
    # cannot make (unstable runs in its yardstick, no spread) is in it with p = 1
    family = [(row, what) for row in rows if row["role"] == "test" for what in ("mean", "spread")]
    adjusted = holm(
        [
            (row.get("p_mean") if what == "mean" else (row.get("spread") or {}).get("p")) or 1.0
            for row, what in family
        ]
    )
    for (row, what), p in zip(family, adjusted, strict=True):
        row[f"holm_{what}"] = p
    for row in rows:
        p = row.get("holm_mean", row.get("p_mean"))
        if row.get("decides") == "tost":
            row["verdict"] = f"equivalent within +-{margin:g}" if p < 0.05 else "cannot tell"
        elif row.get("decides") in ("t", "wilcoxon"):
            row["verdict"] = "different" if p is not None and p < 0.05 else "cannot tell"
        else:
            row["verdict"] = "cannot tell"
        spread = row.get("spread")
        if spread and "holm_spread" in row and row["holm_spread"] >= 0.05:
            spread["verdict"] = "cannot tell"


def _fmt(x, f="+.3f") -> str:
    return "-" if x is None else format(x, f)


def table(rows: list[dict], outcome_rows: list[dict], spec: Multiples) -> list[str]:
    """The report's section: outcomes per arm and factor, then the pairs at each factor."""
    if not rows and not outcome_rows:
        return []
    out = [
        "## Loss at multiples of the best LR",
        "",
        f"Each arm at its best LR ({spec.chosen}) times "
        f"{', '.join(f'{f:g}' for f in spec.factors)}; a slow run (still falling at its end) is "
        "not a failure (lab/multiples.py).",
        "",
        "| arm | x best LR | LR | runs | trained | slow | unstable (kinds) | median final | "
        "norm inputs' mean-energy share (95% CI; chance) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in outcome_rows:
        arm = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r["arm"].items())
        kinds = {k: v for k, v in r["kinds"].items() if k not in ("trained", "slow")}
        shown = ", ".join(f"{v} {k}" for k, v in kinds.items()) or "0"
        e = r.get("mean_energy")
        energy = f"{e['mean']:.3g} ({e['ci'][0]:.3g}-{e['ci'][1]:.3g})" if e else "-"
        energy += f"; {r['chance']:.3g}" if r.get("chance") else ""
        out.append(
            f"| {arm} | {r['factor']:g} | {r['lr']:.3g} | {r['n']} | {r['kinds'].get('trained', 0)}"
            f" | {r['kinds'].get('slow', 0)} | {shown} | {_fmt(r['median_final'], '.3f')} | "
            f"{energy} |"
        )
    if rows:
        out += [
            "",
            "Pairs, paired by seed (a - b, nats; 95% t CI; TOST at the study's margin; with an "
            "unstable run, a Wilcoxon signed-rank test with it as the worst outcome; spread: "
            "sd of a - b over its yardstick's, 95% F interval; Holm over the tests):",
            "",
            "| pair | role | x best LR | n | unstable (a, b) | a - b | 95% CI | verdict | "
            "spread vs identical | smallest resolvable |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            ci = r.get("ci")
            ci = f"{ci[0]:+.3f}..{ci[1]:+.3f}" if ci else "-"
            mean = _fmt(r.get("mean")) if "mean" in r else f"median {_fmt(r.get('median'))}"
            s = r.get("spread")
            spread = (
                f"x{s['ratio']:.2f} ({s['ci'][0]:.2f}-{s['ci'][1]:.2f}): {s['verdict']}"
                if s and s.get("ratio") is not None
                else "-"
            )
            out.append(
                f"| {r['pair']} | {r['role']} | {r['factor']:g} | {r['n']} | "
                f"{r['unstable'][0]}, {r['unstable'][1]} | {mean} | {ci} | {r['verdict']} | "
                f"{spread} | {_fmt(r.get('detectable'), '.3f')} |"
            )
    return [*out, ""]


__all__ = ["Pair", "compare", "outcomes", "table"]
