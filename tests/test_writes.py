"""Nothing lost: every file the project writes goes through one rule (training/rundir.py: a
temporary file beside the target, renamed onto it), so a fault at any byte leaves the old file or
the new one; a full disk is one line and the documented exit code, never a traceback."""

import ast
import errno
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.rundir import replacing, storage_error, write_text

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["train.py", "training", "model", "data", "fused", "normlab", "lab", "scripts", "bench"]
# The writes that do not replace a file through training/rundir.py, each with why it is whole anyway
ALLOWED = {
    ("training/rundir.py", "write_bytes"): "the rule itself: a temporary file, then a rename",
    ("training/checkpoint.py", "save_durably"): "writes save_checkpoint's temporary file",
    ("data/prepare.py", "_build"): "writes inside the .partial folder renamed into place whole",
    ("data/prepare.py", "_write_tokens"): "writes inside the .partial folder renamed into place",
    ("fused/__init__.py", "_place"): "the same rule: fused/ imports only torch, not training/",
    ("training/logger.py", "__init__"): "metrics.jsonl: appended records, a torn last one skipped",
    ("lab/runner.py", "run_one"): "a run's console log, appended",
    ("lab/worker.py", "run_logged"): "a run's console log, appended",
    ("lab/worker.py", "main"): "the answers pipe to the runner, not a file",
    ("lab/pack.py", "pack"): "tarfile.open builds the part in memory; write_bytes writes it",
    ("lab/submit.py", "__call__"): "a run's console log, appended (as lab/runner.py's)",
    ("lab/submit.py", "run_stage"): "a line appended to a run's console log",
    ("training/faults.py", "point"): "an empty marker file (NORMLAB_FAULT_ONCE), fault tests only",
    ("normlab/files.py", "write_bytes"): "the library's copy of the rule (it imports no training/)",
    ("normlab/sinks.py", "__init__"): "metrics.jsonl: appended records, a torn last one skipped",
}


def _writes(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of each call that writes a file: write_text / write_bytes
    methods, savefig, torch.save, open(..., 'w' / 'a' / 'x' ...), os.fdopen(..., 'w')."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef) else where
            if isinstance(child, ast.Call):
                f = child.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                mode = next(
                    (a.value for a in child.args[1:2] if isinstance(a, ast.Constant)), None
                ) or next(
                    (
                        k.value.value
                        for k in child.keywords
                        if k.arg == "mode" and isinstance(k.value, ast.Constant)
                    ),
                    None,
                )
                torch_save = isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "torch"
                writes = name in ("write_text", "write_bytes", "savefig") or (
                    name == "save" and torch_save
                )
                if name in ("open", "fdopen") and isinstance(mode, str) and set(mode) & set("wax"):
                    writes = True
                if isinstance(f, ast.Name) and name in ("write_text", "write_bytes"):
                    writes = False  # training/rundir.py's own functions: the rule
                if name == "savefig" and _in_replacing(child, tree):
                    writes = False
                if writes:
                    found.append((where, child.lineno))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def _in_replacing(call: ast.Call, tree: ast.AST) -> bool:
    """Whether a savefig writes the temporary path of an enclosing `with replacing(...) as tmp`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(
            isinstance(i.context_expr, ast.Call)
            and getattr(i.context_expr.func, "id", "") == "replacing"
            for i in node.items
        ):
            if any(c is call for c in ast.walk(node)):
                return True
    return False


def test_every_file_write_goes_through_the_rule_or_is_listed_with_why():
    unlisted = []
    for root in SOURCES:
        for path in [REPO / root] if root.endswith(".py") else sorted((REPO / root).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for where, line in _writes(path):
                if (rel, where) not in ALLOWED:
                    unlisted.append(f"{rel}:{line} ({where})")
    assert not unlisted, f"writes outside training/rundir.py's rule: {unlisted}"


def test_the_scanner_sees_each_kind_of_write(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "def a(p):\n    p.write_text('x')\ndef b(fig):\n    fig.savefig('f.png')\n"
        "def c(s):\n    torch.save(s, 'x.pt')\ndef d():\n    open('x', 'w')\n"
        "def e():\n    open('x')\n"
        "def f(fig):\n    with replacing(p) as tmp:\n        fig.savefig(tmp)\n"
    )
    assert [w for w, _ in _writes(f)] == ["a", "b", "c", "d"]


def test_a_fault_at_the_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    write_text(target, "old")
    monkeypatch.setenv("NORMLAB_KILL_AT", "write:1:enospc")
    from training import faults

    faults.reset()
    with pytest.raises(OSError) as e:
        write_text(target, "new")
    assert e.value.errno == errno.ENOSPC and target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_kill_mid_write_leaves_the_old_file(tmp_path):
    """SIGKILL with the new file complete beside the old, not yet renamed: the old one stays."""
    target = tmp_path / "report.md"
    write_text(target, "old")
    code = (
        "from pathlib import Path; from training.rundir import write_text; "
        f"write_text(Path({str(target)!r}), 'new')"
    )
    env = {**os.environ, "NORMLAB_KILL_AT": "write:1"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, timeout=60)
    assert r.returncode == -signal.SIGKILL and target.read_text() == "old"


def test_torch_saves_full_disk_is_the_oserror_behind_it(tmp_path):
    """torch.save into a file that fills after 1 kB raises RuntimeError (its zip writer's), the
    disk's OSError its context: storage_error finds it, and replacing raises it."""

    class Full(io.RawIOBase):
        written = 0

        def writable(self):
            return True

        def write(self, b):
            self.written += len(b)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(b)

    with pytest.raises(RuntimeError) as e:
        torch.save({"x": torch.zeros(1000)}, Full())
    assert storage_error(e.value).errno == errno.ENOSPC
    with pytest.raises(OSError) as e, replacing(tmp_path / "c.pt"):
        torch.save({"x": torch.zeros(1000)}, Full())
    assert e.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_report_over_an_old_one_on_a_full_disk_keeps_the_old_one(tmp_path):
    """lab.compare writing its report where one is: ENOSPC at its first whole-file write is one line
    and exit 4, and report.md, report.json are the old ones byte for byte."""
    from conftest import write_run

    for seed in (0, 1):
        write_run(tmp_path / "s", f"a-{seed}", "rmsnorm", 1e-3, seed, "ok", 3.0 + seed / 10)
        write_run(tmp_path / "s", f"b-{seed}", "layernorm", 1e-3, seed, "ok", 3.1 + seed / 10)
    cmd = [sys.executable, "-m", "lab.compare", str(tmp_path / "s"), "--no-figures"]
    assert subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=300).returncode == 0
    old = {n: (tmp_path / "s" / n).read_bytes() for n in ("report.md", "report.json")}
    env = {**os.environ, "NORMLAB_KILL_AT": "write:1:enospc"}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 4 and r.stderr.count("\n") == 1 and "No space left" in r.stderr
    assert {n: (tmp_path / "s" / n).read_bytes() for n in old} == old
    assert not [p for p in (tmp_path / "s").iterdir() if ".tmp-" in p.name]
    json.loads(old["report.json"])


def test_a_tools_storage_fault_is_one_line_whatever_wraps_it():
    """export_hf.py and convert_norms.py: a full disk's OSError, torch's RuntimeError around it, or
    a library's error that only says so, is one line (exit 4); anything else is not for them to
    hide."""
    import errno

    from training.rundir import unwritten

    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise full
        except OSError as e:
            raise RuntimeError("PytorchStreamWriter failed writing file") from e
    except RuntimeError as wrapped:
        line = unwritten("out/x.pt", wrapped)
    assert line == "error: cannot write out/x.pt: No space left on device; nothing was left there"
    assert unwritten("d", Exception("safetensors: No space left on device (os error 28)"))
    assert unwritten("d", ValueError("a bug")) is None
