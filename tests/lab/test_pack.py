"""lab/pack.py: a study's finished runs packed part by part and unpacked on another machine."""

import io
import tarfile

import pytest
from conftest import write_run

from lab import runner
from lab.pack import main, pack, parts, unpack
from training import errors, faults


def _study(root):
    study = root / "demo"
    for f, text in (("sweep.json", '{"runs": []}'), ("study.yaml", "name: demo\n")):
        (study / f).parent.mkdir(parents=True, exist_ok=True)
        (study / f).write_text(text)
    return study


def test_parts_hold_each_finished_run_once_and_restore_it_byte_for_byte(tmp_path):
    study = _study(tmp_path / "studies")
    write_run(study, "a", "rmsnorm", 1e-3, 0, "ok", 3.0)
    write_run(study, "b", "layernorm", 1e-3, 0, "collapsed", 6.0)
    write_run(study, "c", "rmsnorm", 1e-2, 0, "ok", 3.1)
    summary = study / "runs" / "c" / "summary.json"
    done = summary.read_bytes()
    summary.unlink()  # in flight: not packed
    (study / "runs" / "a" / "checkpoints").mkdir()
    (study / "runs" / "a" / "checkpoints" / "latest.pt").write_bytes(b"x" * 100)
    first, n = pack(study, tmp_path / "pending")
    assert n == 2 and first.name == "part-001.tar.xz"
    assert pack(study, tmp_path / "pending") == (None, 0)  # nothing new: no empty part
    summary.write_bytes(done)  # it finished since
    (study / "sweep.json").write_text('{"runs": ["newer"]}')
    second, n = pack(study, tmp_path / "pending")
    assert n == 1 and parts(first.parent) == [first, second]
    with tarfile.open(second) as tar:
        assert {m.split("/")[2] for m in tar.getnames() if m.count("/") == 3} == {"c"}
    back, n = unpack(first.parent, tmp_path / "next")
    assert n == 3 and (back / "sweep.json").read_text() == '{"runs": ["newer"]}'  # the last part's
    for run in ("a", "b", "c"):
        for f in (study / "runs" / run).glob("*.*"):
            assert (back / "runs" / run / f.name).read_bytes() == f.read_bytes()
        assert runner.state(back / "runs" / run) == "finished"
    assert not (back / "runs" / "a" / "checkpoints").exists()


def test_unpack_refuses_an_existing_folder_and_a_member_outside_the_study(tmp_path, capsys):
    study = _study(tmp_path / "studies")
    write_run(study, "a", "rmsnorm", 1e-3, 0, "ok", 3.0)
    part, _ = pack(study, tmp_path / "pending")
    with pytest.raises(errors.BadInput, match="exists: unpack into a study folder"):
        unpack(part.parent, tmp_path / "studies")
    with tarfile.open(part.parent / "part-002.tar.xz", "w:xz") as tar:
        info = tarfile.TarInfo("elsewhere/x.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(errors.BadInput, match="holds elsewhere/x.txt: a part holds only files"):
        unpack(part.parent, tmp_path / "next")
    for name in ("demo/../../escape.txt", "demo/link"):
        with tarfile.open(part.parent / "part-002.tar.xz", "w:xz") as tar:
            info = tarfile.TarInfo(name)
            if name.endswith("link"):
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            else:
                info.size = 1
            tar.addfile(info, io.BytesIO(b"x") if info.size else None)
        with pytest.raises(errors.BadInput, match=f"holds {name}: a part holds only files"):
            unpack(part.parent, tmp_path / "next")
        assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "next" / "demo").exists()  # refused before anything was written
    with pytest.raises(errors.BadInput, match="not a study folder"):
        pack(tmp_path, tmp_path / "pending")
    assert main([str(study), str(tmp_path / "pending")]) == 0
    assert "no run finished since the last part" in capsys.readouterr().out


def test_a_full_disk_is_one_line_exit_4_and_leaves_no_part(tmp_path, capsys, monkeypatch):
    """ENOSPC at the part's whole-file write (the fault train.py's tests inject): exit 4, one line
    naming the folder, no part-001 (a later pack writes it whole); unpacking then works."""
    study = _study(tmp_path / "studies")
    write_run(study, "a", "rmsnorm", 1e-3, 0, "ok", 3.0)
    faults.reset()  # counts are per process: the first write from here
    monkeypatch.setenv("NORMLAB_KILL_AT", "write:1:enospc")
    assert main([str(study), str(tmp_path / "pending")]) == runner.EXIT_STORAGE == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left" in err and "pending" in err, err
    assert not parts(tmp_path / "pending" / "demo")
    monkeypatch.delenv("NORMLAB_KILL_AT")
    assert main([str(study), str(tmp_path / "pending")]) == 0
    assert main(["--unpack", str(tmp_path / "pending" / "demo"), "--out", str(tmp_path / "n")]) == 0
    assert runner.state(tmp_path / "n" / "demo" / "runs" / "a") == "finished"
