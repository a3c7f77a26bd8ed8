"""The right error (issue 78): every tool, each failure class, its exit code and one line on
stderr, never a traceback for a known cause (training/errors.py, docs/usage.md's table).
In-process: no process boundary is under test here (tests/catalog.py drives them as commands on a
real full disk)."""

import errno
import gzip
import os
import shutil
from pathlib import Path

import pytest
from conftest import TINY

import train
from lab.compare import compare
from lab.pack import main as pack
from lab.readme import main as readme
from lab.redecide import main as redecide
from lab.sweep import sweep
from normlab import inspect
from scripts import convert_norms, export_hf, sample
from training import errors

REPO = Path(__file__).resolve().parent.parent


def said(capsys) -> str:
    """The one line a tool printed on stderr (and no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def full_disk(m):
    """Every rename onto a destination fails as a full disk does (ENOSPC, the path named)."""

    def enospc(src, dst, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    m.setattr(os, "replace", enospc)
    m.setattr(os, "rename", enospc)


def test_the_classes_and_their_codes():
    assert errors.classify(KeyboardInterrupt()) == (130, "interrupted")
    code, line = errors.classify(OSError(errno.ENOSPC, "No space left on device", "out/x"))
    assert code == 4 and line.startswith("error: cannot write out/x: No space left on device")
    for e in (errno.EDQUOT, errno.EROFS, errno.EIO):
        assert errors.classify(OSError(e, os.strerror(e), "p"))[0] == 4
    # never a storage code for what is not one
    assert errors.classify(FileNotFoundError(errno.ENOENT, "No such file", "in/x")) == (
        2,
        "error: in/x: it does not exist",
    )
    assert errors.classify(NotADirectoryError(errno.ENOTDIR, "Not a directory", "f"))[0] == 2
    assert errors.classify(ValueError("a bad value")) == (2, "error: a bad value")
    wrapped = RuntimeError("PytorchStreamWriter failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device", "ck.pt")
    assert errors.classify(wrapped)[0] == 4
    assert errors.classify(RuntimeError("a bug")) is None  # its traceback is kept


def test_a_bug_keeps_its_traceback():
    def main(argv):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        errors.run(main)


def test_usage_errors_are_one_line_and_code_2(capsys):
    with pytest.raises(SystemExit) as e:
        sample.main(["runs/x", "--tokens", "-1"])
    assert e.value.code == 2
    assert said(capsys).startswith("error: argument --tokens: -1 must be an integer >= 1 (see")


@pytest.mark.slow
def test_train_py(tmp_path, capsys, monkeypatch):
    base = ["--config", TINY, f"log.out_dir={tmp_path}", "--name", "r"]
    assert train.main([*base, "model.max_seq_len=16", "train.seq_len=32"]) == 2
    assert said(capsys).startswith("error: model.max_seq_len=16 differs from train.seq_len=32")
    (tmp_path / "file").write_text("x")
    assert train.main(["--config", TINY, f"log.out_dir={tmp_path / 'file'}", "--name", "r"]) == 2
    line = said(capsys)
    assert line.startswith("error: cannot write the run's files: ") and "log.out_dir" in line
    with monkeypatch.context() as m:
        full_disk(m)
        assert train.main([*base, "train.steps=10"]) == 4
        assert said(capsys).startswith("error: cannot write the run's files: ")


@pytest.mark.slow
def test_the_tools_over_a_run(tmp_path, capsys, monkeypatch, run_tiny):
    assert run_tiny("--name", "ln", "--norm", "layernorm") == 0
    assert run_tiny("--name", "rms") == 0
    run = tmp_path / "ln"
    capsys.readouterr()
    (tmp_path / "file").write_text("x")
    assert sample.main([str(tmp_path / "nope")]) == 2
    assert "is not a run directory" in said(capsys)
    assert export_hf.main([str(run), str(tmp_path / "file")]) == 2
    assert (
        said(capsys)
        == f"error: {tmp_path / 'file'} is a file; the export is a folder: choose another path"
    )
    assert convert_norms.main([str(run), str(tmp_path / "file")]) == 2
    assert "is in the way" in said(capsys)
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    (bad / "config.yaml").write_text("model: {dim: [\n")
    assert inspect.main([str(bad), "--out", str(tmp_path / "page")]) == 2
    assert "config.yaml is not YAML" in said(capsys)
    with monkeypatch.context() as m:  # a full disk: code 4, the path that failed
        full_disk(m)
        assert inspect.main([str(run), "--out", str(tmp_path / "page2")]) == 4
        assert said(capsys).startswith(f"error: cannot write {tmp_path / 'page2'}")
        assert export_hf.main([str(tmp_path / "rms"), str(tmp_path / "exp")]) == 4
        assert said(capsys).startswith("error: cannot write ")


@pytest.mark.slow
def test_the_lab_commands(tmp_path, capsys, monkeypatch):
    study = tmp_path / "dup.yaml"
    study.write_text(
        "name: dup\nabout: x\nconfig: tiny.yaml\ngrid: {norm: [rmsnorm], lr: [1.0e-3]}\n"
        "protocol: {selection_seeds: [0, 1], test_seeds: [2, 2, 3]}\n"
    )
    assert sweep([str(study), "--dry-run"]) == 2
    assert said(capsys).endswith("protocol.test_seeds lists 2 twice; each value once")
    (tmp_path / "file").write_text("x")
    quick = str(REPO / "lab" / "studies" / "quick.yaml")
    assert sweep([quick, "--out", str(tmp_path / "file")]) == 2
    assert (
        said(capsys) == f"error: --out {tmp_path / 'file'} is a file: give the folder studies go in"
    )
    with monkeypatch.context() as m:
        full_disk(m)
        assert sweep([quick, "--out", str(tmp_path / "studies")]) == 4
        line = said(capsys)
        assert line.startswith(f"error: cannot write {tmp_path / 'studies'}") and " . " not in line
    assert compare([str(tmp_path / "nope")]) == 2
    assert said(capsys).endswith("is not a folder of run directories")
    folder = tmp_path / "critical-lr-control"
    shutil.copytree(REPO / "lab" / "results" / "critical-lr-control", folder)
    (folder / "runs.json.gz").write_bytes(gzip.compress(b"[{")[:20])
    assert redecide([str(folder)]) == 2
    assert "runs.json.gz is damaged" in said(capsys)
    assert readme(["--results", str(tmp_path / "nope")]) == 2
    assert said(capsys) == f"error: {tmp_path / 'nope'} is not a folder"
    (tmp_path / "pending" / "q").mkdir(parents=True)
    (tmp_path / "pending" / "q" / "part-001.tar.xz").write_bytes(b"\xfd7zXZ\x00\x00" + b"0" * 50)
    assert pack(["--unpack", str(tmp_path / "pending" / "q"), "--out", str(tmp_path / "s")]) == 2
    assert "part-001.tar.xz is damaged" in said(capsys)
    assert pack([str(tmp_path / "pending"), str(tmp_path / "p")]) == 2
    assert "is not a study folder" in said(capsys)


def test_an_interrupt_is_130_in_one_line(tmp_path, capsys, monkeypatch):
    import lab.compare

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(lab.compare, "write_report", interrupted)
    (tmp_path / "r").mkdir()
    assert compare([str(tmp_path / "r")]) == 130
    assert said(capsys) == "interrupted"
