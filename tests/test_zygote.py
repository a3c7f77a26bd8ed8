"""tests/zygote.py: a process forked from the test forkserver is what subprocess would start."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import zygote

pytestmark = pytest.mark.slow  # processes

SCRIPT = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "pythonpath": [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p],
    "in_path": [p for p in sys.path if p.startswith(os.environ.get("PROBE_DIR", "/nowhere"))],
    "env": os.environ.get("PROBE"),
    "stdin": sys.stdin.read(),
    "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").split(b"\\0")[1:],
    "pgid_is_parents": os.getpgid(0) == int(os.environ["PARENT_PGID"]),
    "name": __name__,
    "torch": "torch" in sys.modules,  # what differs: the forked one has it already
}, default=lambda b: b.decode()))
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "exit":
    sys.exit(int(sys.argv[2]))
if how == "message":
    sys.exit("a message")
if how == "raise":
    raise ValueError("boom")
if how == "interrupt":
    raise KeyboardInterrupt
if how == "sleep":
    import time
    time.sleep(60)
"""


def _both(tmp_path, *args, **kw):
    """The same command forked and started as usual: (forked, usual) CompletedProcess."""
    (tmp_path / "probe.py").write_text(SCRIPT)
    env = {
        **os.environ,
        "PROBE": "x y",
        "PROBE_DIR": str(tmp_path),
        "PARENT_PGID": str(os.getpgid(0)),
    }
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "lib"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "probe.py", *args]
    out = []
    for forked in (True, False):
        with contextlib.nullcontext() if forked else zygote.real():
            out.append(
                subprocess.run(
                    cmd, cwd=tmp_path, env=env, input="in", capture_output=True, text=True, **kw
                )
            )
    return out


@pytest.mark.parametrize(
    "args, code",
    [(["exit", "0"], 0), (["exit", "3"], 3), (["message"], 1), (["raise"], 1), (["interrupt"], -2)],
)
def test_a_forked_process_sees_and_ends_as_a_started_one(tmp_path, args, code):
    forked, usual = _both(tmp_path, *args)
    assert forked.returncode == usual.returncode == code
    seen, seen_forked = json.loads(usual.stdout), json.loads(forked.stdout)
    assert seen_forked.pop("torch") and not seen.pop("torch")  # it was forked
    assert seen_forked == seen
    assert seen["argv"] == ["probe.py", *args] and seen["cmdline"] == ["probe.py", *args]
    assert seen["env"] == "x y" and seen["stdin"] == "in" and seen["pgid_is_parents"]
    assert seen["in_path"] == [str(tmp_path), str(tmp_path / "lib")]
    # the last line of stderr (a traceback's, a message's) is the same
    assert forked.stderr.strip().splitlines()[-1] == usual.stderr.strip().splitlines()[-1]


def test_a_forked_process_is_signalled_by_its_pid_and_found_by_its_command_line(tmp_path):
    (tmp_path / "probe.py").write_text(SCRIPT)
    env = {**os.environ, "PARENT_PGID": str(os.getpgid(0))}
    p = subprocess.Popen(
        [sys.executable, "probe.py", "sleep", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert isinstance(p, zygote.Popen) and p._conn is not None  # forked, not started
    first = p.stdout.readline()
    assert json.loads(first)["argv"][1] == "sleep"
    found = subprocess.run(
        ["pgrep", "-f", f"probe.py sleep {tmp_path}"], capture_output=True, text=True
    ).stdout.split()
    assert found == [str(p.pid)] and p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == -signal.SIGTERM
    time.sleep(0.1)
    assert p.poll() == -signal.SIGTERM


def test_only_plain_python_commands_are_forked(tmp_path):
    """-c, other interpreter flags, other programs and a changed interpreter environment start as
    usual."""

    def forked(cmd, env=None):
        p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL)
        p.wait(timeout=60)
        return p._conn is not None

    (tmp_path / "s.py").write_text("pass\n")
    assert forked([sys.executable, "s.py"]) and forked([sys.executable, "-u", "s.py"])
    assert forked([sys.executable, "-m", "json.tool", "--help"])
    assert not forked([sys.executable, "-c", "pass"])
    assert not forked([sys.executable, "-X", "importtime", "s.py"])
    assert not forked(["true"])
    assert not forked([sys.executable, "s.py"], env={**os.environ, "PYTHONHASHSEED": "7"})
    with zygote.real():
        assert not forked([sys.executable, "s.py"])


def test_a_forked_processs_own_python_children_are_forked_too(tmp_path):
    """A child has what the server's imports set in its environment (torch sets
    TORCHINDUCTOR_CACHE_DIR), and passes it on: its children are forked all the same (torchrun's
    ranks, a sweep's workers)."""
    (tmp_path / "inner.py").write_text("import sys\nprint('torch' in sys.modules)\n")
    (tmp_path / "outer.py").write_text(
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, 'inner.py'], stdout=subprocess.PIPE, text=True)\n"
        "print(p.communicate()[0].strip(), p._conn is not None)\n"
    )
    out = subprocess.run([sys.executable, "outer.py"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
    imported = zygote._server()["imported"]
    assert "TORCHINDUCTOR_CACHE_DIR" in imported
    p = subprocess.Popen([sys.executable, "inner.py"], cwd=tmp_path, env={**os.environ, **imported})
    p.wait(timeout=60)
    assert p._conn is not None
