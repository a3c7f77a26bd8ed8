"""Python processes for the tests without paying for torch's imports each time (issue 77).

Most of the suite's CPU went into ~200 launches of `python train.py ...` / `python -m ...`, each
spending ~2.5 s importing torch, torch._dynamo (which torch's optimizer imports), TensorBoard and
NumPy before its first step. Here a server that has imported those third-party libraries once
forks a fresh process for each such command a test starts, as Python's multiprocessing forkserver
does for its workers. The forked process is a real one: its own pid, command line (what `ps` and
`pgrep -f` show), process group, standard streams, working directory, environment, signals and
exit status, exactly as subprocess would give it. It imports this project's code itself, from its
own working directory and PYTHONPATH; only the third-party modules are already in memory.

`Popen` replaces subprocess.Popen in the test processes (tests/conftest.py) and in the processes
forked here (so torchrun's ranks and a sweep's workers are forked too). It forks only plain
`sys.executable [-u] SCRIPT ...` and `sys.executable [-u] -m MODULE ...` commands of the server's
session; anything else (other interpreter flags, -c, shell, preexec_fn, pass_fds, a different
interpreter environment) starts as usual, and so does every command inside `with real():` (a
test about a process's own start-up) or of a suite run with NORMLAB_TEST_FORKSERVER=0.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import inspect
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

PRELOAD = [
    "numpy",
    "yaml",
    "omegaconf",
    "tqdm",
    "torch",
    "torch._dynamo",
    "torch.utils.tensorboard",
]
# a child differing from the server in these would start differently: it starts as usual
STARTUP_ENV = (
    *("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS", "ATEN_", "ONEDNN_", "DNNL_"),
    *("TORCH_LOGS", "TORCHDYNAMO", "TORCHINDUCTOR"),
)  # (not PYTORCH_*: Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK in-process; torch reads it late)
# set up in the child (torch.set_num_threads sets both libraries' counts)
PER_CHILD_ENV = {"PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}
TITLE_BYTES = 32768  # room for the child's command line in the server's argv
_EXECUTE = inspect.signature(subprocess.Popen._execute_child)
_REAL = subprocess.Popen
enabled = os.environ.get("NORMLAB_TEST_FORKSERVER", "1") != "0"


# ---------------------------------------------------------------------------------------------
# the test's side


@contextlib.contextmanager
def real():
    """Start processes as usual inside this block (a test about a process's own start-up)."""
    global enabled
    before, enabled = enabled, False
    try:
        yield
    finally:
        enabled = before


class Popen(_REAL):
    """subprocess.Popen whose plain `python ...` commands are forked by the server."""

    _conn: socket.socket | None = None

    def _execute_child(self, *args):
        a = _EXECUTE.bind(self, *args).arguments
        request = _request(a)
        if request is None:
            return super()._execute_child(*args)
        fds = [
            a["p2cread"] if a["p2cread"] != -1 else 0,
            a["c2pwrite"] if a["c2pwrite"] != -1 else 1,
            a["errwrite"] if a["errwrite"] != -1 else 2,
        ]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(_server()["path"])
        body = json.dumps(request).encode()
        socket.send_fds(conn, [struct.pack("!Q", len(body))], fds)
        conn.sendall(body)
        self._conn, self._buf = conn, b""
        self.pid = int(self._line())
        self._child_created = True
        self._close_pipe_fds(
            a["p2cread"], a["p2cwrite"], a["c2pread"], a["c2pwrite"], a["errread"], a["errwrite"]
        )

    def _line(self) -> bytes:
        while b"\n" not in self._buf:
            part = self._conn.recv(4096)
            if not part:
                raise ChildProcessError("the test forkserver lost a child")
            self._buf += part
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _try_wait(self, wait_flags):
        if self._conn is None:
            return super()._try_wait(wait_flags)
        if wait_flags & os.WNOHANG and b"\n" not in self._buf:
            if not select.select([self._conn], [], [], 0)[0]:
                return (0, 0)
        status = int(self._line())  # the raw wait status, as os.waitpid gives it
        self._conn.close()
        return (self.pid, status)

    def _internal_poll(self, _deadstate=None, **kw):
        if self._conn is None:
            return super()._internal_poll(_deadstate, **kw)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode


def _request(a: dict) -> dict | None:
    """What the server needs to fork this command, or None where it starts as usual."""
    argv = a["args"]
    if not (enabled and isinstance(argv, (list, tuple)) and len(argv) >= 2):
        return None
    if a["shell"] or a["preexec_fn"] or a["pass_fds"] or a["executable"] is not None:
        return None
    if a["uid"] is not None or a["gid"] is not None or a["gids"] is not None:
        return None
    if a["umask"] >= 0 or a["process_group"] not in (None, -1) or not a["restore_signals"]:
        return None
    argv = [os.fsdecode(x) for x in argv]
    if argv[0] != sys.executable:
        return None
    cwd = os.fsdecode(a["cwd"]) if a["cwd"] is not None else os.getcwd()
    env = {os.fsdecode(k): os.fsdecode(v) for k, v in (a["env"] or os.environ).items()}
    unbuffered = argv[1] == "-u"
    i = 2 if unbuffered else 1
    if len(argv) > i + 1 and argv[i] == "-m":
        kind, target, rest = "module", argv[i + 1], argv[i + 2 :]
    elif len(argv) > i and not argv[i].startswith("-"):
        kind, target, rest = "script", argv[i], argv[i + 1 :]
    else:
        return None
    if kind == "script" and not os.path.isfile(os.path.join(cwd, target)):
        return None  # python's own message and exit code
    if not os.path.isdir(cwd):
        return None
    server = _server()
    if not _same_start(env, server) or os.getsid(0) != server["sid"]:
        return None
    return {
        "kind": kind,
        "target": target,
        "argv": argv,
        "rest": rest,
        "cwd": cwd,
        "env": env,
        "unbuffered": unbuffered,
        "new_session": bool(a["start_new_session"]),
        "pgid": os.getpgid(0),
    }


def _startup_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_ENV) and k not in PER_CHILD_ENV}


def _same_start(env: dict, server: dict) -> bool:
    """Whether `env` starts an interpreter as the server's did, counting what the server's imports
    set as set (torch sets TORCHINDUCTOR_CACHE_DIR; a process that imported it passes it on)."""
    imported = server["imported"]
    mine = {k: v for k, v in _startup_env(env).items() if imported.get(k) != v}
    theirs = {k: v for k, v in server["startup"].items() if imported.get(k) != v}
    return mine == theirs


_lock = threading.Lock()
_state: dict = {}  # this process's server: pid (of this process), path, startup env, sid


def _server() -> dict:
    """This process's server (started on first use; it ends when this process does)."""
    with _lock:
        if _state.get("pid") != os.getpid():
            folder = tempfile.mkdtemp(prefix="normlab-zygote-")
            path = os.path.join(folder, "s")
            proc = _REAL(
                [sys.executable, __file__, path, "#" * TITLE_BYTES],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
            )
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError("the test forkserver did not start")
            atexit.register(_stop, proc)
            _state.update(pid=os.getpid(), **json.loads(proc.stdout.readline()))
        return _state


def _stop(proc) -> None:
    proc.stdin.close()  # end of this process: the server exits
    proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# the server's side


def serve(path: str) -> None:
    startup, before = _startup_env(os.environ), dict(os.environ)
    for name in PRELOAD:
        __import__(name)
    # what the imports set (torch's TORCHINDUCTOR_CACHE_DIR): a started process sets it too
    imported = {k: v for k, v in os.environ.items() if before.get(k) != v}
    import torch

    threads = torch.get_num_threads()  # the default of a process started without OMP_NUM_THREADS
    base_path = [p for p in sys.path[1:] if p not in _pythonpath(os.environ)]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the monitors reap themselves
    server = {"path": path, "startup": startup, "sid": os.getsid(0), "imported": imported}
    sys.stdout.write("ready\n" + json.dumps(server) + "\n")
    sys.stdout.flush()
    while True:
        ready = select.select([listener, sys.stdin], [], [])[0]
        if sys.stdin in ready:  # the test process ended
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
            return
        conn, _ = listener.accept()
        header, fds, _, _ = socket.recv_fds(conn, 8, 3)
        (size,) = struct.unpack("!Q", header)
        body = b""
        while len(body) < size:
            body += conn.recv(size - len(body))
        if os.fork() == 0:
            _monitor(conn, fds, json.loads(body), threads, base_path, listener, server)
        conn.close()
        for fd in fds:
            os.close(fd)


def _monitor(conn, fds, request, threads, base_path, listener, server) -> None:
    """A forked process that forks the command's process, tells the test its pid, and then its
    wait status."""
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(fds, request, threads, base_path, server)
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        _, status, usage = os.wait4(pid, 0)
        conn.sendall(f"{status}\n".encode())
        log = request["env"].get("NORMLAB_ZYGOTE_CPU_LOG")  # CPU per test, for profiling the suite
        if log:
            with open(log, "a") as f:
                test = request["env"].get("PYTEST_CURRENT_TEST", "")
                f.write(json.dumps([test, usage.ru_utime + usage.ru_stime]) + "\n")
    finally:
        os._exit(0)


def _child(fds, request, threads, base_path, server) -> None:
    """Become `python argv...`: streams, session, directory, environment, command line, then run."""
    if request["new_session"]:
        os.setsid()
    else:
        try:
            os.setpgid(0, request["pgid"])  # the test's process group, as a child of it has
        except OSError:
            pass
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    os.closerange(3, 65536)
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    for key, value in server["imported"].items():
        os.environ.setdefault(key, value)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _set_title(request["argv"])
    unbuffered = request["unbuffered"] or bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = _stream(0, "r", False)
    sys.stdout = sys.__stdout__ = _stream(1, "w", unbuffered)
    sys.stderr = sys.__stderr__ = _stream(2, "w", unbuffered, errors="backslashreplace")
    import random

    import numpy
    import torch

    random.seed()
    numpy.random.seed()
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or threads))
    script = request["kind"] == "script"  # sys.path[0]: the script's folder, or the cwd for -m
    head = os.path.dirname(os.path.abspath(request["target"])) if script else os.getcwd()
    sys.path[:] = [head, *_pythonpath(env), *base_path]
    subprocess.Popen = Popen  # its own `python ...` children are forked here too
    _state.update(pid=os.getpid(), **server)
    code = _run(request)
    os._exit(code)


def _run(request) -> int:
    """Run the script or module as __main__; the exit code Python would give (an uncaught
    KeyboardInterrupt ends the process by SIGINT after its traceback, as Python does)."""
    import runpy
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    interrupted = False
    try:
        try:
            if request["kind"] == "script":
                sys.argv = [request["target"], *request["rest"]]
                path = request["target"]
                with open(path, "rb") as f:
                    source = f.read()
                main.__dict__.update(__file__=path, __builtins__=__builtins__)
                exec(compile(source, path, "exec"), main.__dict__)
            else:
                sys.argv = ["-m", *request["rest"]]
                runpy._run_module_as_main(request["target"])
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except BaseException as e:
            sys.excepthook(*sys.exc_info())
            code, interrupted = 1, isinstance(e, KeyboardInterrupt)
        threading._shutdown()
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e.code)
    flushed = _flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code if flushed else 120


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _flush() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            ok = False
    return ok


def _stream(fd: int, mode: str, unbuffered: bool, errors: str = "strict"):
    """A standard stream as Python sets one up (line-buffered on a terminal; stderr always)."""
    import io

    encoding = os.environ.get("PYTHONIOENCODING", "utf-8").split(":")[0] or "utf-8"
    if mode == "r":
        return io.TextIOWrapper(open(fd, "rb", closefd=False), encoding=encoding)
    raw = io.FileIO(fd, "w", closefd=False)
    line = fd == 2 or raw.isatty()
    if unbuffered:
        return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)
    buffered = io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=encoding, errors=errors, line_buffering=line)


def _pythonpath(env) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _set_title(argv: list[str]) -> None:
    """Write the command line into this process's argv memory: /proc/PID/cmdline (ps, pgrep -f)
    shows it, as it shows a started process's."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49
    title = b"\0".join(os.fsencode(x) for x in argv) + b"\0"
    if len(title) > end - start:
        raise RuntimeError(f"command line longer than {end - start} bytes: {argv[:3]}")
    ctypes.memmove(start, title + b"\0" * (end - start - len(title)), end - start)


if __name__ == "__main__":
    serve(sys.argv[1])
