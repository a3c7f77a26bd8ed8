"""Files the monitor writes, each replaced atomically: a reader (or a crash) sees the old file or
the new one, never half of one."""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (where the OS can open a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def os_error(e: BaseException) -> OSError | None:
    """The OSError behind an error (torch.save turns a full disk's OSError into a RuntimeError whose
    context it is), or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


@contextmanager
def replacing(path: Path, before_rename=None):
    """A temporary path beside `path` (same folder, same suffix) for a writer that wants a file
    name (savefig, torch.save): renamed onto `path` when the block ends (after `before_rename()`,
    a hook for fault injection), removed if it raised. A fault at any byte leaves the old file or
    the new one; a failed write is the OSError behind it, naming `path` where it names no file."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        try:
            yield tmp
            if before_rename is not None:
                before_rename()
            os.replace(tmp, path)
        except Exception as e:
            err = os_error(e)
            if err is not None and err.filename is None:  # a failed write() names no file
                err = OSError(err.errno, err.strerror, str(path))
            raise (err or e) from None
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes, before_rename=None) -> None:
    """Replace a file atomically (a reader sees the old or the new content, never half) and
    durably (fsynced before the rename, the rename fsynced after: a power cut leaves the old file or
    the new one, never an empty one)."""
    with replacing(path, before_rename) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def clean(v):
    """JSON has no NaN / inf: a non-finite number is written as null."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def record_line(step: int, metrics: dict) -> str:
    """One metrics.jsonl line: {"step": step, key: value, ...}, non-finite values as null."""
    return json.dumps({"step": step, **{k: clean(v) for k, v in metrics.items()}}) + "\n"


def read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl (a torn last line, from a crash mid-write, is skipped; a
    missing file has none)."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(r, dict) and isinstance(r.get("step"), int):
                    records.append(r)
    except FileNotFoundError:
        pass
    return records
