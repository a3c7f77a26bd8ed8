"""Atomic save / load of the full training state, for exact resume."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from training import faults


class CheckpointError(ValueError):
    """An unreadable or incompatible checkpoint: the message is the one line the user sees."""


def previous_path(path: Path) -> Path:
    return path.with_name(f"previous{path.suffix}")


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write `state` so that `path` always holds a complete checkpoint, and the one before it stays as
    previous.pt until the new one is durable: temp file, fsync, latest -> previous, temp -> latest, fsync dir."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed mid-write
        if not stale.name.endswith(f"-{os.getpid()}"):
            stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_durably(state, tmp)
        faults.point("checkpoint")
        if path.exists():
            os.replace(path, previous_path(path))
            faults.point("checkpoint_swap")
        os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, never half of one
        fsync_dir(path.parent)  # make the renames themselves durable
    finally:
        tmp.unlink(missing_ok=True)


def save_durably(obj, path: Path) -> None:
    """torch.save to `path`, flushed and fsynced (on disk before anything is renamed onto it)."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make the renames inside directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def has_checkpoint(path: str | Path) -> bool:
    """A checkpoint to resume from: latest.pt / previous.pt, or a sharded run's latest.dcp / previous.dcp."""
    path = Path(path)
    return path.is_file() or previous_path(path).is_file() or any(
        (path.with_name(f"{n}.dcp") / "extra.pt").is_file() for n in ("latest", "previous"))


def has_pt(path: str | Path) -> bool:
    """A one-file checkpoint (latest.pt or previous.pt) beside `path`."""
    return Path(path).is_file() or previous_path(Path(path)).is_file()


def load_checkpoint(path: str | Path) -> dict:
    """The state saved at `path` (tensors on CPU), or CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {str(e).strip().splitlines()[0][:200]}") from None


def load_latest(path: str | Path) -> tuple[dict, str | None]:
    """(state, warning): the newest readable checkpoint, latest.pt or else previous.pt (the warning says why it
    fell back); CheckpointError naming both when neither can be read."""
    path = Path(path)
    try:
        return load_checkpoint(path), None
    except CheckpointError as latest_error:
        try:
            state = load_checkpoint(previous_path(path))
        except CheckpointError as previous_error:
            raise CheckpointError(f"{latest_error}; and {previous_error}") from None
        return state, f"{latest_error}: resuming from {previous_path(path).name} (step {state.get('step')})"


def rng_state() -> dict:
    """The CPU generator and, on a GPU machine, the current device's: a process drives one device, and a
    checkpoint must resume where fewer (or other) GPUs are visible."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore rng_state(); CheckpointError (one line) when it does not fit this machine."""
    try:
        torch.set_rng_state(state["torch"])
        cuda = state.get("cuda")
        if cuda is not None and torch.cuda.is_available():
            if isinstance(cuda, (list, tuple)):  # older checkpoints: one state per visible device
                device = torch.cuda.current_device()
                if device >= len(cuda):
                    raise CheckpointError(f"the checkpoint holds CUDA RNG states for {len(cuda)} devices; this "
                                          f"process drives device {device}")
                cuda = cuda[device]
            torch.cuda.set_rng_state(cuda)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"cannot restore the RNG state: {(str(e).strip().splitlines() or [repr(e)])[0][:200]}"
                              ) from None
