"""A study's persistent worker: `python -m lab.worker [LABEL]` trains run after run in one process
(lab/runner.py's Worker starts it), so that Python, torch and the kernels are paid once, not per
run.

Each stdin line is a request {"argv": [train.py's arguments], "log": path}; the run's output (stdout
and stderr, at the file-descriptor level, as a process of its own writes it) is appended to the log,
and one line {"exit_code": N} answers on stdout ({"exit_code": 2, "error": ...} for a malformed
request). LABEL is free text for `ps`. A run computes what `python train.py ARGV` computes:
everything it depends on (seeds, threads, its files) is set by the run itself. A run that raises
what train.py does not handle (exit 1), or is interrupted, ends the worker after its answer (its
state is unknown); the runner starts a new one.

Like scripts/, this program stands outside the import order: it runs train.py's main in-process.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

import train

# train.py's documented exit codes (docs/usage.md) that the worker answers itself
EXIT_OK, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 2, 130


def serve(requests, answers) -> int:
    """Answer each request line with the exit code of its run; the worker's own exit code."""
    for line in requests:
        try:
            request = json.loads(line)
            argv, log = request["argv"], request["log"]
            if not isinstance(log, str) or not all(isinstance(a, str) for a in argv):
                raise TypeError
        except (ValueError, TypeError, KeyError):
            error = (
                f"error: malformed request {line.strip()[:200]!r}: expected "
                '{"argv": [train.py arguments], "log": "path"}'
            )
            answers.write(json.dumps({"exit_code": EXIT_BAD_INPUT, "error": error}) + "\n")
            continue
        try:
            code, fatal = run_logged(argv, log)
        except OSError as e:  # the log cannot be opened: the run never started
            error = f"error: cannot open the run's log {log}: {e.strerror or e}"
            answers.write(json.dumps({"exit_code": EXIT_BAD_INPUT, "error": error}) + "\n")
            continue
        answers.write(json.dumps({"exit_code": code}) + "\n")
        if fatal or code in (1, EXIT_INTERRUPTED):  # a bug (state unknown), or the study stops
            return code
    return EXIT_OK


def run_logged(argv: list[str], log: str) -> tuple[int, bool]:
    """train.main(argv), file descriptors 1 and 2 sent to `log`; (exit code, worker must end)."""
    code, fatal, saved = 1, False, [os.dup(1), os.dup(2)]
    with open(log, "a") as f:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
        try:
            code = train.main(argv)
        except SystemExit as e:  # argparse's usage errors (exit 2), as a process would end
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        except KeyboardInterrupt:
            code, fatal = EXIT_INTERRUPTED, True
        except BaseException:  # noqa: BLE001  a crash: its traceback, then a fresh worker
            traceback.print_exc()
            code, fatal = 1, True
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, copy in ((1, saved[0]), (2, saved[1])):
                os.dup2(copy, fd)
                os.close(copy)
    gc.collect()  # the run's model, optimizer and lock go now, not at some later run's allocation
    return code, fatal


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed between runs goes to stderr, never into the answers
    try:
        return serve(sys.stdin, answers)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group, an idle worker too
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
