"""lab/analyses/failure_onset.py: the first step a failed run's train loss jumps, by hand."""

import json
import math

import pytest
from conftest import write_run

from lab.analyses.failure_onset import main, onset, table


def test_the_onset_is_the_first_jump_above_the_running_minimum_or_a_non_finite_loss():
    rec = [{"step": s, "train/loss": v} for s, v in enumerate([5.0, 4.0, 4.9, 3.0, 4.1], 1)]
    assert onset(rec, 1.0) == 5  # 4.9 is 0.9 above 4.0; 4.1 is 1.1 above 3.0
    assert onset(rec, 0.5) == 3
    assert onset(rec, 2.0) is None
    assert onset([{"step": 7}, {"step": 8, "train/loss": math.nan}], 1.0) == 8


def _failed(tmp_path, name, seed, losses):
    write_run(tmp_path, name, "rmsnorm", 1.0, seed, "diverged", None)
    path = tmp_path / "runs" / name / "metrics.jsonl"
    rows = [{"step": s, "train/loss": v} for s, v in enumerate(losses, 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_table_counts_each_arms_onsets_after_each_step(tmp_path, capsys):
    _failed(tmp_path, "a", 0, [5.0, 4.0, 9.0])  # onset 3
    _failed(tmp_path, "b", 1, [5.0] + [4.0] * 70 + [6.0])  # onset 72
    write_run(tmp_path, "ok", "rmsnorm", 1e-3, 2, "ok", 3.0)  # trained: not counted
    rows = table([tmp_path], 1.0, [20, 64])
    assert rows[-1] == "| all | 2 | 2 | 37.5 | 72 | 1 | 1 |"
    assert main([str(tmp_path), "--after", "2", "100"]) == 0
    assert "| all | 2 | 2 | 37.5 | 72 | 2 | 0 |" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing")]) == 2


@pytest.mark.parametrize("jump", [0.5, 1.0])
def test_no_failed_run_is_one_line(tmp_path, capsys, jump):
    write_run(tmp_path, "ok", "rmsnorm", 1e-3, 0, "ok", 3.0)
    assert main([str(tmp_path), "--jump", str(jump)]) == 2
    assert capsys.readouterr().err.startswith("error: no failed runs under")


@pytest.mark.parametrize("bad", [["--jump", "nan"], ["--jump", "0"], ["--after", "-1"]])
def test_its_arguments_obey_the_number_rule(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), *bad])
    assert e.value.code == 2 and bad[0] in capsys.readouterr().err
