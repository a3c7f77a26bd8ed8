"""The committed paired critical LRs, recomputed from runs.json alone by code of this file: the
failure rule re-implemented from docs/METHODS.md's text (float64, numpy's least squares), each
seed's bracket, the paired log differences, the t interval and TOST; nothing from lab/ is used."""

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

RESULTS = Path(__file__).resolve().parents[2] / "lab" / "results"


def _failed(run: dict, rule: dict, steps: int) -> bool:
    """The speed-free rule with above_unigram: non-finite or diverged; an eval blowup_margin above
    its best so far, or above L0; a final eval above the unigram entropy; a final eval within the
    learn margin whose last half's least-squares slope falls less than slow_slope per 10%."""
    if run["summary"]["status"] in ("diverged", "crashed"):
        return True
    l0 = next(v for s, v in run["val"] if s == 0)
    evals = [(s, v) for s, v in run["val"] if s > 0]
    if not evals or not all(math.isfinite(v) for _, v in evals):
        return True
    best = math.inf
    for _, v in evals:
        if v > best + rule["blowup_margin"] or v > l0:
            return True
        best = min(best, v)
    unigram, final = run["summary"]["unigram_entropy"], evals[-1][1]
    if final > unigram:
        return True
    if final > unigram - rule["learn_margin"]:
        half = np.array([(s, v) for s, v in evals if s >= steps / 2], float)
        slope = np.polyfit(half[:, 0], half[:, 1], 1)[0]
        return not -slope * 0.1 * steps > rule["slow_slope"]
    return False


def _critical(outcomes: dict[float, bool]) -> float | None:
    """The geometric midpoint of the largest trained and the smallest failed LR; None where one
    side is missing or the outcomes are not monotone."""
    ok = [lr for lr, bad in outcomes.items() if not bad]
    bad = [lr for lr, bad in outcomes.items() if bad]
    if not ok or not bad or min(bad) < max(ok):
        return None
    return math.sqrt(max(ok) * min(bad))


@pytest.mark.parametrize(
    "study",
    ["critical-lr", "critical-lr-control", "critical-lr-pystdlib", "centring", "centring-width"],
)
def test_the_committed_critical_lr_pairs_are_recomputed_from_their_runs(study):
    folder = RESULTS / study
    spec = yaml.safe_load((folder / "study.yaml").read_text())
    rule, steps = spec["failure"], spec["overrides"]["train"]["steps"]
    assert rule["speed_free"] and rule["above_unigram"] and rule["above_l0"]
    seeds = set(spec["protocol"]["critical"]["seeds"])
    report = json.loads((folder / "report.json").read_text())
    keys = report["arm_keys"]
    outcomes = defaultdict(lambda: defaultdict(dict))  # arm -> seed -> lr -> failed
    for run in json.loads(gzip.decompress((folder / "runs.json.gz").read_bytes())):
        c = run["config"]
        if c["train.seed"] in seeds:
            arm = "/".join(f"{k.split('.')[-1]}={c[k]}" for k in keys)
            outcomes[arm][c["train.seed"]][c["optim.lr"]] = _failed(run, rule, steps)

    def arm(label: str) -> str:  # report labels: 'layernorm/post/zero_mean_writers=False'
        parts = zip(keys, label.split("/"), strict=True)
        return "/".join(f"{k.split('.')[-1]}={v.split('=')[-1]}" for k, v in parts)

    rows = [r for r in report["critical"] if "error" not in r]
    assert rows and len(rows) == len(report["critical"])
    for row in rows:
        a, b = outcomes[arm(row["a"])], outcomes[arm(row["b"])]
        d = np.array(
            [
                math.log(ca / cb)
                for s in sorted(seeds)
                if (ca := _critical(a.get(s, {}))) and (cb := _critical(b.get(s, {})))
            ]
        )
        n, m, sd = len(d), d.mean(), d.std(ddof=1)
        se, t = sd / math.sqrt(n), stats.t.ppf(0.975, n - 1)
        lm = math.log(row["margin"])
        p_tost = max(stats.t.sf((m + lm) / se, n - 1), stats.t.cdf((m - lm) / se, n - 1))
        p = 2 * stats.t.sf(abs(m) / se, n - 1)
        verdict = "agrees" if p_tost < 0.05 else "differs" if p < 0.05 else "inconclusive"
        said = f"{study}: {row['a']} / {row['b']}"
        assert n == row["n"], said
        # runs.json keeps each LR to 3 significant digits: the midpoints move by < 0.5%
        assert math.exp(m) == pytest.approx(row["ratio"], rel=5e-3), said
        assert math.exp(m - t * se) == pytest.approx(row["ci"][0], rel=1e-2), said
        assert math.exp(m + t * se) == pytest.approx(row["ci"][1], rel=1e-2), said
        assert sd == pytest.approx(row["sd"], abs=0.01), said
        assert verdict == row["verdict"], said
