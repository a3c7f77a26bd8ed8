"""Reading a study folder: find_runs reads each run folder once per change (a sweep decides every
stage from all its runs so far), and a resumed stage counts every finished run (constructed run
folders, no training)."""

import json

from conftest import write_run

import lab.read as read


def test_a_changed_run_is_read_again_and_callers_cannot_change_the_next_read(tmp_path):
    write_run(tmp_path, "a", "rmsnorm", 0.01, 0, "ok", 3.5)
    write_run(tmp_path, "b", "layernorm", 0.01, 0, "ok", 3.6)
    first = {r.name: r for r in read.find_runs([tmp_path])}
    assert first["a"].summary["final_val_loss"] == 3.5 and len(first["a"].records) == 4
    first["a"].summary["final_val_loss"] = -1.0  # a caller's edit stays in its own copy
    first["a"].config["optim.lr"] = 99.0
    again = {r.name: r for r in read.find_runs([tmp_path])}
    assert again["a"].summary["final_val_loss"] == 3.5 and again["a"].config["optim.lr"] == 0.01
    assert again["b"].records is first["b"].records  # not read again: nothing changed
    # every write in the project is a rename (a new file): the new summary is read
    summary = tmp_path / "runs" / "a" / "summary.json"
    new = {**json.loads(summary.read_text()), "status": "diverged", "final_val_loss": None}
    (tmp_path / "tmp.json").write_text(json.dumps(new))
    (tmp_path / "tmp.json").replace(summary)
    # and a metrics file grows by appending: its new records are read
    with open(tmp_path / "runs" / "a" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "train/loss": 4.5}) + "\n")
    last = {r.name: r for r in read.find_runs([tmp_path])}
    assert last["a"].summary["status"] == "diverged" and last["a"].summary["final_val_loss"] is None
    assert [r["step"] for r in last["a"].records] == [0, 1, 2, 3, 4]
    assert last["a"].why is not None and last["b"].why is None


def test_a_resumed_stage_counts_the_earlier_rounds_finished_runs(tmp_path):
    """A protocol stage names only the runs it still wants: the sweep's 'N runs, M already
    finished' counts every finished run in the study's folder, not the stage's."""
    from lab.runner import finished_runs

    for i, status in enumerate(["ok", "collapsed", "ok"]):
        write_run(tmp_path, f"r{i}", "rmsnorm", 0.01 * (i + 1), 0, status, 3.5)
    (tmp_path / "runs" / "in-flight").mkdir()  # no summary: not finished
    (tmp_path / "runs" / ".r9.lock").touch()
    stage = [{"name": "r2"}, {"name": "r3"}]  # r3 not made yet
    assert finished_runs(tmp_path, stage, [{"name": "r3"}]) == {"r0", "r1", "r2"}
