"""Where centring matters (lab/centring.py) on constructed arms: regimes, orientation RMSNorm over
LayerNorm, the mean-energy fractions at the best LR and the loss difference's sign."""

import math
from types import SimpleNamespace as NS

import pytest

from lab import centring, critical
from lab.studyfile import Critical

SEEDS = range(10, 26)


def _arm(crit: dict, config: dict, energy: tuple[float, float]):
    """Seed s fails at every LR >= crit[s] (an x1.1 grid near it); at the best LR 1e-3, two runs
    whose layers' mean-energy fractions are `energy` at their first and last stats step, +-0.01."""
    lrs = [0.01 * 1.1**k for k in range(40)]
    runs = [
        NS(seed=s, lr=lr, failed=lr >= c, finished=True, config=config)
        for s, c in crit.items()
        for lr in lrs
        if abs(math.log(lr / c)) < 0.2
    ]
    best = [
        NS(
            records=[
                {"step": 0, **{f"norm_in/mean_energy/layer_{i}": energy[0] + d for i in range(2)}},
                {"step": 20, "train/loss": 5.0},
                {"step": 40, **{f"norm_in/mean_energy/layer_{i}": energy[1] + d for i in range(2)}},
            ]
        )
        for d in (-0.01, 0.01)
    ]
    return NS(runs=runs, best_lr=1e-3, at=lambda lr: best if lr == 1e-3 else [])


def test_each_regime_is_one_row_oriented_rmsnorm_over_layernorm():
    crit = {s: 0.05 * math.exp(0.3 * math.sin(2.0 * s)) for s in SEEDS}
    wobble = {s: c * (1.02 if s % 2 else 0.98) for s, c in crit.items()}
    wide = {s: c * 1.5 for s, c in wobble.items()}
    plain, offset = {"model.init_embedding_mean": 0.0}, {"model.init_embedding_mean": 0.45}
    arms = {  # LayerNorm first in one regime, RMSNorm first in the other: both read RMS over LN
        "ln/plain": _arm(crit, plain | {"model.norm": "layernorm"}, (0.03, 0.004)),
        "rms/plain": _arm(wobble, plain | {"model.norm": "rmsnorm"}, (0.03, 0.03)),
        "a-rms/offset": _arm(wide, offset | {"model.norm": "rmsnorm"}, (0.8, 0.6)),
        "ln/offset": _arm(crit, offset | {"model.norm": "layernorm"}, (0.8, 0.1)),
    }
    loss = NS(mean=-0.05, ci=(-0.07, -0.03), n=16, verdict="different")
    res = NS(
        file=NS(
            protocol=NS(critical=Critical(seeds=tuple(SEEDS), resolution=1.19, margin=1.1)),
            rule=NS(describe=lambda: "a rule"),
        ),
        arms=arms,
        keys=["model.norm", "model.init_embedding_mean"],
        # stored as A - B with A the LayerNorm arm: RMS - LN is +0.05
        comparisons=[
            NS(
                a=NS(label="ln/plain"),
                b=NS(label="rms/plain"),
                key="model.norm",
                loss=NS(paired=loss),
            )
        ],
    )
    stored = {(r["a"], r["b"]): r for r in critical.comparisons(res) if r["key"] == "model.norm"}
    rows = {r["regime"]: r for r in centring.rows(res)}
    assert set(rows) == {"init_embedding_mean=0.0", "init_embedding_mean=0.45"}
    p, o = rows["init_embedding_mean=0.0"], rows["init_embedding_mean=0.45"]
    assert (p["rmsnorm"], p["layernorm"]) == ("rms/plain", "ln/plain")
    assert (o["rmsnorm"], o["layernorm"]) == ("a-rms/offset", "ln/offset")
    # one of the two is stored LayerNorm over RMSNorm: its ratio and CI come back inverted
    for r in (p, o):
        s = stored.get((r["rmsnorm"], r["layernorm"]))
        if s is not None:
            assert r["ratio"] == s["ratio"] and r["ci"] == s["ci"]
        else:
            s = stored[r["layernorm"], r["rmsnorm"]]
            assert r["ratio"] == pytest.approx(1 / s["ratio"])
            assert r["ci"] == pytest.approx([1 / s["ci"][1], 1 / s["ci"][0]])
        assert r["ci"][0] < r["ratio"] < r["ci"][1]
    assert p["verdict"] == "agrees" and p["ratio"] == pytest.approx(1.0, abs=0.05)
    assert o["verdict"] == "differs" and o["ratio"] == pytest.approx(1.5, rel=0.1)
    assert p["energy_layernorm"] == pytest.approx((0.03, 0.004))
    assert o["energy_rmsnorm"] == pytest.approx((0.8, 0.6))
    assert p["loss"] == {"mean": 0.05, "ci": [0.03, 0.07], "n": 16, "verdict": "different"}
    assert "loss" not in o
    text = "\n".join(centring.table(res))
    assert (
        "verdicts by regime: agrees: init_embedding_mean=0.0; differs: init_embedding_mean" in text
    )
    assert "| init_embedding_mean=0.0 | 0.030 -> 0.030 | 0.030 -> 0.004 |" in text
    assert "+0.050 (+0.030..+0.070; n 16; different)" in text


def test_no_norm_pair_no_section():
    res = NS(file=NS(protocol=None), arms={}, keys=[], comparisons=[])
    assert centring.rows(res) == [] and centring.table(res) == []
