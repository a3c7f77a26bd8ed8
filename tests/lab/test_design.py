"""A study folder remembers the design its runs were made under (lab/design.py): a sweep or a report
with a changed study file refuses in one line naming what changed, unless the file's `history:`
says why; then the report says which runs were made under which design."""

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import write_run

import lab.sweep as sweep_cli
from lab.compare import compare
from lab.design import changes, check, design_of, pin
from lab.runner import _write_index
from lab.studyfile import load_study
from lab.sweep import sweep
from training.config import ConfigError

TINY = Path(__file__).resolve().parents[2] / "configs" / "train" / "tiny.yaml"
STUDY = "name: s\nconfig: {tiny}\ngrid: {{norm: [rmsnorm, layernorm], lr: [0.01], seed: [0, 1]}}\n"


def _study(tmp_path, extra: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(STUDY.format(tiny=TINY) + extra)
    return path


def test_a_design_is_the_study_file_and_its_config_less_its_notes(tmp_path):
    base = design_of(load_study(_study(tmp_path)))
    noted = design_of(load_study(_study(tmp_path, "history: [a note]\n")))
    assert base["hash"] == noted["hash"] and noted["notes"] == 1
    wider = design_of(load_study(_study(tmp_path, "overrides: {model: {dim: 64}}\n")))
    assert wider["hash"] != base["hash"]
    assert changes(base, wider) == ["overrides", "the training config's model.dim"]
    lrs = design_of(load_study(_study(tmp_path).parent / "s.yaml"))
    more = dict(lrs, study={**lrs["study"], "grid": {**lrs["study"]["grid"], "optim.lr": [0.1]}})
    assert changes(lrs, more) == ["grid.optim.lr"]


def test_a_changed_file_is_refused_until_its_history_says_why(tmp_path):
    folder = tmp_path / "out" / "s"
    folder.mkdir(parents=True)
    first = pin(folder, load_study(_study(tmp_path)), "s.yaml")
    assert pin(folder, load_study(_study(tmp_path)), "s.yaml") == first  # the same: nothing new
    edited = load_study(_study(tmp_path, "overrides: {train: {steps: 40}}\n"))
    with pytest.raises(ConfigError) as e:
        pin(folder, edited, "s.yaml")
    said = str(e.value)
    assert "\n" not in said and "changed since its runs" in said and "train.steps" in said
    assert len(json.loads((folder / "design.json").read_text())["designs"]) == 1  # untouched
    why = 'history: ["2026-12-04 steps 20 -> 40: the runs had not converged"]\n'
    second = pin(
        folder, load_study(_study(tmp_path, "overrides: {train: {steps: 40}}\n" + why)), "s"
    )
    designs = json.loads((folder / "design.json").read_text())["designs"]
    assert [d["hash"] for d in designs] == [first, second] and first != second
    assert designs[1]["changed"] == [
        "overrides",
        "the training config's optim.schedule_steps, train.steps",
    ]
    assert designs[1]["why"].startswith("2026-12-04 steps 20 -> 40")


def test_a_sweep_over_a_changed_file_refuses_and_a_report_says_which_runs_which_design(
    tmp_path, monkeypatch, capsys
):
    """The sweep (run_study faked: it writes finished runs) refuses an edited file in one line and
    leaves the folder as it was; with a history note it goes on, and the report counts the runs of
    each design. A hand-edited copy beside the runs is refused by the report."""
    made = []

    def fake(study, runs, study_dir, workers=None, process_per_run=False, running=None):
        index = {}
        for spec in runs:
            if not (study_dir / "runs" / spec["name"]).exists():
                v = dict(o.split("=", 1) for o in spec["overrides"])
                seed, norm = int(v["train.seed"]), v["model.norm"]
                write_run(study_dir, spec["name"], norm, 0.01, seed, "ok", 3.0 + seed / 10)
                made.append(spec["name"])  # a run made now is made under the current design
                index[spec["name"]] = {
                    "name": spec["name"],
                    "status": "ok",
                    "design": study.design,
                }
        old = study_dir / "sweep.json"
        if old.is_file():
            index = {e["name"]: e for e in json.loads(old.read_text())["runs"]} | index
        _write_index(old, study, runs, index, running)
        return {"ok": len(runs)}

    monkeypatch.setattr(sweep_cli, "run_study", fake)
    out = tmp_path / "out"
    argv = lambda path: [str(path), "--out", str(out), "--no-report"]  # noqa: E731
    assert sweep(argv(_study(tmp_path))) == 0 and len(made) == 4
    copy = (out / "s" / "study.yaml").read_text()
    capsys.readouterr()
    assert sweep(argv(_study(tmp_path, "grid_note: x\n"))) == 2  # not a study key: bad input
    edited = _study(tmp_path).read_text().replace("seed: [0, 1]", "seed: [0, 1, 2]")
    (tmp_path / "s.yaml").write_text(edited)
    capsys.readouterr()
    assert sweep(argv(tmp_path / "s.yaml")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid.train.seed" in err[0] and "history:" in err[0]
    assert (out / "s" / "study.yaml").read_text() == copy and len(made) == 4
    (tmp_path / "s.yaml").write_text(edited + 'history: ["a third seed: the spread was wide"]\n')
    assert sweep(argv(tmp_path / "s.yaml")) == 0 and len(made) == 6
    text = (compare([str(out / "s"), "--no-figures"]), (out / "s" / "report.md").read_text())[1]
    assert "runs by design:" in text and "(since" in text and "4 runs)" in text
    assert "2 runs): changed grid.train.seed; why: a third seed: the spread was wide" in text
    report = json.loads((out / "s" / "report.json").read_text())
    assert [d["runs"] for d in report["designs"]] == [4, 2]
    hand = (out / "s" / "study.yaml").read_text().replace("lr: [0.01]", "lr: [0.02]")
    (out / "s" / "study.yaml").write_text(hand)
    capsys.readouterr()
    assert compare([str(out / "s"), "--no-figures"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid.optim.lr" in err[0]


def test_a_folder_from_before_designs_were_recorded_reports_as_it_did(tmp_path):
    assert check(tmp_path, load_study(_study(tmp_path)), "s.yaml") == []


def test_a_quick_sweep_pins_the_file_its_report_reads_and_a_changed_set_is_refused(
    tmp_path, monkeypatch, capsys
):
    """The design is the file as the folder's study.yaml keeps it (a --quick sweep's report reads
    that file, not the quick section) plus the sweep's --set overrides."""

    def fake(study, runs, study_dir, workers=None, process_per_run=False, running=None):
        _write_index(study_dir / "sweep.json", study, runs, {}, running)
        return {"ok": len(runs)}

    monkeypatch.setattr(sweep_cli, "run_study", fake)
    path = _study(tmp_path, "quick: {grid: {seed: [0]}}\n")
    out = tmp_path / "out"
    argv = [str(path), "--quick", "--out", str(out), "--no-report", "--set", "train.steps=7"]
    assert sweep(argv) == 0
    folder = out / "s-quick"
    assert check(folder, load_study(folder / "study.yaml"), "study.yaml")  # the report's check
    assert sweep(argv) == 0  # the same sweep again: the same design
    capsys.readouterr()
    assert sweep([*argv[:-1], "train.steps=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set" in err[0]


def test_a_design_does_not_depend_on_where_the_checkout_is(tmp_path):
    """The same study file and config in two checkouts (a pinned worktree, a moved clone) are one
    design: the config is hashed by content, not by its absolute path."""
    import shutil

    other = tmp_path / "elsewhere"
    other.mkdir()
    for name in ("tiny.yaml", "default.yaml"):  # tiny.yaml is a diff on default.yaml
        shutil.copy(TINY.parent / name, other / name)
    here = load_study(_study(tmp_path))
    there = dataclasses.replace(here, config=str(other / "tiny.yaml"))
    assert design_of(here)["hash"] == design_of(there)["hash"]


def test_a_config_field_the_code_gained_at_its_default_is_no_change(tmp_path):
    """A folder's design recorded before the training config had a field (optim.warmup_fraction,
    issue 61) still reports and sweeps as the same design while the field is at its default; at any
    other value the change is named and refused as any other."""
    folder = tmp_path / "out" / "s"
    folder.mkdir(parents=True)
    first = pin(folder, load_study(_study(tmp_path)), "s.yaml")
    path = folder / "design.json"
    saved = json.loads(path.read_text())
    del saved["designs"][0]["config"]["optim.warmup_fraction"]  # as made before the field was
    saved["designs"][0]["hash"] = old = "0123456789ab"  # ... and hashed without it
    path.write_text(json.dumps(saved))
    study = load_study(_study(tmp_path))
    assert design_of(study)["hash"] == first != old
    assert check(folder, study, "s.yaml")[-1]["hash"] == old
    assert pin(folder, study, "s.yaml") == old  # later runs: the same design
    assert len(json.loads(path.read_text())["designs"]) == 1
    other = load_study(_study(tmp_path, "overrides: {optim: {warmup_fraction: 0.1}}\n"))
    with pytest.raises(ConfigError, match="optim.warmup_fraction"):
        check(folder, other, "s.yaml")


def test_every_committed_studys_design_is_its_study_file_today():
    """A field the code gained since (at its default) changes no committed study's design: each
    folder's last design has no changes against its study file as the code reads it now."""
    from lab.design import changes, design_of
    from lab.studyfile import load_study

    repo = Path(__file__).resolve().parents[2]
    for path in sorted((repo / "lab" / "results").glob("*/design.json")):
        last = json.loads(path.read_text())["designs"][-1]
        now = design_of(load_study(repo / "lab" / "studies" / f"{path.parent.name}.yaml"))
        assert not changes(last, now), (path.parent.name, changes(last, now))


def test_a_field_the_engine_gained_is_left_out_of_a_design_while_at_its_default():
    """pre-edge-length's runs were made before `multiples.compare` existed: its design then and
    now is the same text, and a study that sets the field has it in its design."""
    from lab.design import _written
    from lab.studyfile import Multiples, Pair

    before = "Multiples(factors=(10.0,), best_lr=(({'model.norm': 'rmsnorm'}, 0.03),), chosen='x')"
    m = Multiples(factors=(10.0,), best_lr=(({"model.norm": "rmsnorm"}, 0.03),), chosen="x")
    assert _written(m) == before and repr(m).startswith(before[:-1])
    pair = Pair(name="t", a=(("model.norm", "rmsnorm"),), b=(("model.norm", "layernorm"),))
    with_pairs = dataclasses.replace(m, compare=(pair,))
    assert _written(with_pairs) == before[:-1] + f", compare=({pair!r},))"
