"""Spike precursors (lab/precursors.py) on constructed metrics: which signal crossed its own
threshold first, by how many steps, and the report's table."""

import math

from lab.precursors import table
from normlab.spikes import crossings, leads, loss_spikes


def _records(n=80, spike=60, rms_at=55, logit_at=60, layers=2):
    """A falling loss with small noise and one spike at `spike`; RMS_t of layer 1 jumps at rms_at,
    the attention-logit max of layer 0 at logit_at; log Z stays quiet."""
    out = []
    for s in range(1, n + 1):
        r = {"step": s, "train/loss": 5 * math.exp(-s / 50) + 0.01 * math.sin(s)}
        if s == spike:
            r["train/loss"] *= 3
        for i in range(layers):
            r[f"optim/rms_t/layer_{i}"] = (
                1 + 0.01 * math.cos(s + i) + (5 if i == 1 and s == rms_at else 0)
            )
            r[f"attn/logit_max/layer_{i}"] = (
                3 + 0.02 * math.sin(2 * s + i) + (10 if i == 0 and s == logit_at else 0)
            )
            r[f"update/ratio/layer_{i}"] = 0.01 + 1e-4 * math.sin(3 * s + i)
            r[f"update/ratio/layer_{i}/gains"] = 5.0 if s == spike - 3 else 0.01  # not a family key
        r["logits/log_z"] = 6.9 + 0.001 * math.sin(s)
        out.append(r)
    return out


def test_a_signal_crosses_its_own_trailing_median_plus_k_robust_sd():
    values = [(s, 1.0 + 0.01 * math.sin(s)) for s in range(1, 41)]
    values[30] = (31, 2.0)
    assert crossings(values, window=20, k=5.0) == [31]
    assert crossings(values[:20], window=20) == []  # judged once 20 values are known


def test_each_spike_gets_each_familys_lead_and_the_earliest_layer_counts():
    records = _records()
    assert loss_spikes(records) == [60]
    (got,) = leads(records)
    assert got == {"update norm": None, "RMS_t": 5, "attention-logit max": 0, "log Z": None}
    far = _records(rms_at=45)  # 15 steps before: beyond the lookback
    assert leads(far)[0]["RMS_t"] is None


def test_the_table_says_per_arm_how_often_each_family_led():
    runs = [(_records(), 5, 5.0), (_records(rms_at=58), 5, 5.0)]
    lines = table({"rmsnorm/pre": runs, "quiet": [([{"step": 1, "train/loss": 1.0}], 5, 5.0)]})
    assert lines[0] == "## Spike precursors (exploratory)"
    row = next(line for line in lines if line.startswith("| rmsnorm/pre |"))
    assert row == (
        "| rmsnorm/pre | 2 | 0/2 led, 0 same step | 2/2 led, 0 same step, median 3.5 steps | "
        "0/2 led, 2 same step | 0/2 led, 0 same step |"
    )
    assert not any(line.startswith("| quiet") for line in lines)
    assert table({"quiet": [([{"step": 1, "train/loss": 1.0}], 5, 5.0)]}) == []


def test_a_diverged_runs_null_losses_end_its_spikes_and_do_not_break_the_table():
    """train.py writes a non-finite loss as null: the spikes are those before it (a study with a run
    at lr 30 tracebacked here)."""
    records = _records()
    for r in records[65:]:
        r["train/loss"] = None
    assert loss_spikes(records) == loss_spikes(records[:65]) == [60]
    assert table({"a": [(records, 5, 5.0)]})  # the spike at 60 and its leads
