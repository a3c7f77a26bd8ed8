"""Every tool's failure classes and exit codes, in one place (docs/usage.md's table); torch-free.

    2    bad input or a damaged input file: the file or key, what is wrong, what is allowed
    3    a run that ended unstable (a result: train.py only)
    4    a storage fault the OS reports (ENOSPC, EDQUOT, EROFS, EIO): the path that failed; every
         file is the old one or the new one
    5    another process of a multi-process job failed first (train.py under torchrun)
    130  interrupted (Ctrl-C, SIGTERM)

A tool's main runs under `run(main, argv)`: an error of a known class ends it with its code and
one line on stderr (`error: ...`), never a traceback; anything else is a bug and keeps its
traceback. `Parser` is argparse's parser with a one-line usage error."""

from __future__ import annotations

import argparse
import errno
import sys

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_STORAGE = 4
EXIT_PEER = 5
EXIT_INTERRUPTED = 130

# the OS's words for a storage fault: the only errors exit code 4 is given to
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}


class BadInput(Exception):
    """Bad input or a damaged input file; its message names the file or key and what is allowed."""


def chain(e: BaseException):
    """e and the errors it was raised from or during, innermost last (each once)."""
    seen = set()
    while e is not None and id(e) not in seen:
        yield e
        seen.add(id(e))
        e = e.__cause__ or e.__context__


def storage_fault(e: BaseException) -> OSError | None:
    """The OSError behind e whose errno is a storage fault (torch.save and safetensors wrap a full
    disk's OSError in their own errors), or None: no other error is one."""
    for x in chain(e):
        if isinstance(x, OSError) and x.errno in STORAGE_ERRNOS:
            return x
    if any("No space left on device" in str(x) for x in chain(e)):  # a library that kept only
        return OSError(errno.ENOSPC, "No space left on device")  # the text, not the error
    return None


def path_error(e: BaseException) -> OSError | None:
    """An OSError about a path the user gave (missing, a file where a folder is wanted, or the
    other way round, not permitted): bad input, not a storage fault."""
    for x in chain(e):
        if isinstance(x, OSError) and x.errno not in STORAGE_ERRNOS and x.errno is not None:
            return x
    return None


def storage_line(err: OSError, where=None) -> str:
    """The one line of a storage fault: the path that failed, why; files are whole."""
    path = err.filename or where
    return (
        f"error: cannot write {path}: {err.strerror or err}; every file there is whole (the old "
        "one or the new one): free some space (or make it writable), then run the command again"
    )


def path_line(err: OSError, where=None) -> str:
    path = err.filename or where
    hint = {
        errno.ENOENT: "it does not exist",
        errno.ENOTDIR: "a file stands where a folder is needed",
        errno.EEXIST: "a file of that name is in the way",
        errno.EISDIR: "it is a folder, a file is needed",
        errno.EACCES: "not permitted",
        errno.EPERM: "not permitted",
    }.get(err.errno, err.strerror or str(err))
    return f"error: {path}: {hint}"


def classify(e: BaseException, where=None, bad=(ValueError,)) -> tuple[int, str] | None:
    """(exit code, one line) of an error a tool ends with, or None for a bug (its traceback is
    kept). `bad`: the tool's own bad-input error classes (ValueError and BadInput always are);
    `where`: the path a write went to, where the error does not name one."""
    if isinstance(e, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    err = storage_fault(e)
    if err is not None:
        return EXIT_STORAGE, storage_line(err, where)
    if isinstance(e, (BadInput, ValueError, *bad)) and not isinstance(e, OSError):
        text = str(e).strip().splitlines()
        line = text[0] if text else type(e).__name__
        return EXIT_BAD_INPUT, line if line.startswith("error: ") else f"error: {line}"
    err = path_error(e)
    if err is not None:
        return EXIT_BAD_INPUT, path_line(err, where)
    return None


def run(main, argv=None, bad=(), where=None) -> int:
    """main(argv) with every known error class ended by its code and one line (classify)."""
    try:
        return main(argv)
    except SystemExit:
        raise
    except BaseException as e:
        known = classify(e, where, bad)
        if known is None:
            raise
        code, line = known
        print(line, file=sys.stderr, flush=True)
        return code


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line (the error and where to read more), exit
    code 2, as every other bad input."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")
