"""Where centring matters (issue 60; docs/METHODS.md, mean-energy fraction): per regime (the arms'
fields other than the norm), what the block norms read, the paired critical-LR ratio RMSNorm /
LayerNorm and the loss difference RMSNorm - LayerNorm at each one's best LR."""

from __future__ import annotations

from lab import critical
from lab.arms import mean_of
from lab.findings import energy_ends

NORM = "model.norm"


def energy(arm) -> tuple[float, float] | None:
    """The arm's mean-energy fraction at its first and last stats step, over its best LR's runs."""
    runs = arm.at(arm.best_lr) if arm.best_lr is not None else []
    ends = [e for run in runs if (e := energy_ends(run)) is not None]
    if not ends:
        return None
    return mean_of([e[0] for e in ends]), mean_of([e[1] for e in ends])


def rows(res) -> list[dict]:
    """Per RMSNorm / LayerNorm pair with paired critical LRs, RMSNorm over LayerNorm: its regime,
    both arms' energies, the critical ratio (CI, n, verdict) and the best-LR loss difference."""
    loss = {(c.a.label, c.b.label): c.loss.paired for c in res.comparisons if c.key == NORM}
    out = []
    for r in critical.comparisons(res):
        if r["key"] != NORM or "error" in r:
            continue
        arms = {res.arms[x].runs[0].config.get(NORM): x for x in (r["a"], r["b"])}
        if set(arms) != {"rmsnorm", "layernorm"}:
            continue
        flip = arms["rmsnorm"] == r["b"]
        lo, hi = r["ci"]
        row = {
            "regime": ", ".join(
                f"{k.split('.')[-1]}={res.arms[r['a']].runs[0].config.get(k)}"
                for k in res.keys
                if k != NORM
            )
            or "-",
            "rmsnorm": arms["rmsnorm"],
            "layernorm": arms["layernorm"],
            "energy_rmsnorm": energy(res.arms[arms["rmsnorm"]]),
            "energy_layernorm": energy(res.arms[arms["layernorm"]]),
            "ratio": 1 / r["ratio"] if flip else r["ratio"],
            "ci": [1 / hi, 1 / lo] if flip else [lo, hi],
            "n": r["n"],
            "verdict": r["verdict"],
            "p_tost": r["p_tost"],
            "p": r["p"],
        }
        p = loss.get((r["a"], r["b"]))
        if p is not None and p.mean is not None:
            sign = -1 if flip else 1
            ci = None if p.ci is None else sorted(sign * x for x in p.ci)
            row["loss"] = {"mean": sign * p.mean, "ci": ci, "n": p.n, "verdict": p.verdict}
        out.append(row)
    return out


def table(res) -> list[str]:
    """The report's section: the rows' table and which regimes differ; [] where there are none."""
    got = rows(res)
    if not got:
        return []

    def e(x):
        return "-" if x is None else f"{x[0]:.3f} -> {x[1]:.3f}"

    lines = []
    for r in got:
        loss = r.get("loss")
        cell = "-"
        if loss:
            ci = "no CI" if loss["ci"] is None else f"{loss['ci'][0]:+.3f}..{loss['ci'][1]:+.3f}"
            cell = f"{loss['mean']:+.3f} ({ci}; n {loss['n']}; {loss['verdict']})"
        lines.append(
            f"| {r['regime']} | {e(r['energy_rmsnorm'])} | {e(r['energy_layernorm'])} | "
            f"{r['ratio']:.3f} ({r['ci'][0]:.3f}-{r['ci'][1]:.3f}) | {r['n']} | "
            f"**{r['verdict']}** | {r['p_tost']:.2g} / {r['p']:.2g} | {cell} |"
        )
    by = {}
    for r in got:
        by.setdefault(r["verdict"], []).append(r["regime"])
    said = "; ".join(f"{v}: {', '.join(regimes)}" for v, regimes in sorted(by.items()))
    return [
        "## Where centring matters",
        "",
        "Per regime, RMSNorm against LayerNorm: the block norms' inputs' mean-energy fraction "
        "mean(x)^2 / mean(x^2) (the part LayerNorm removes and RMSNorm keeps; averaged over "
        "layers, first -> last stats step, at each arm's best LR), the paired critical-LR ratio "
        "RMSNorm / LayerNorm (its 95% CI, seeds, TOST / t-test p) and the loss RMSNorm - "
        "LayerNorm at each one's best LR on the test seeds (nats). Critical-LR verdicts by "
        f"regime: {said}.",
        "",
        "| regime | mean-energy, RMSNorm | mean-energy, LayerNorm | critical LR RMS / LN "
        "(95% CI) | seeds | verdict | TOST p / t p | loss RMS - LN (95% CI; n; verdict) |",
        "|---|---|---|---|---|---|---|---|",
        *lines,
        "",
    ]
