"""Atomic save / load of the full training state, for exact resume."""

from __future__ import annotations

import os
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """An unreadable or incompatible checkpoint: the message is the one line the user sees."""


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write `state` so that `path` always holds a complete checkpoint: temp file, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, never half of one
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # make the rename itself durable
        finally:
            os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | Path) -> dict:
    """The state saved at `path` (tensors on CPU), or CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {str(e).strip().splitlines()[0][:200]}") from None


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
