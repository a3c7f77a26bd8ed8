"""find_runs reads each run folder once per change: a sweep decides every stage from all its runs
so far, and a changed file is read again (constructed run folders, no training)."""

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
