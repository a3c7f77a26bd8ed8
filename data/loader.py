"""Seeded, resumable, model-independent batches of (x, y) windows from memmapped token shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from data.sources import DataError


def load_tokens(prepared: str | Path, split: str) -> np.memmap:
    """The token ids of `split` ('train' or 'val') of a prepared dataset, memory-mapped; DataError
    (one line) when the files do not match meta.json (a truncated copy, a damaged disk)."""
    prepared = Path(prepared)
    meta = read_meta(prepared)
    path = prepared / f"{split}.bin"
    expected = meta[f"{split}_tokens"] * np.dtype(meta["dtype"]).itemsize
    size = path.stat().st_size if path.is_file() else None
    if size != expected:
        raise DataError(
            f"prepared dataset {prepared} is damaged: {path.name} has "
            f"{'no file' if size is None else f'{size:,} bytes'}, meta.json says {expected:,}; "
            f"delete the directory to prepare it again"
        )
    return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")


def read_meta(prepared: Path) -> dict:
    """A prepared dataset's meta.json, or DataError naming it."""
    try:
        meta = json.loads((prepared / "meta.json").read_text())
        for key in ("dtype", "train_tokens", "val_tokens"):
            meta[key]
        np.dtype(meta["dtype"])
        return meta
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"prepared dataset {prepared} is damaged: cannot read its meta.json ({e}); delete the "
            f"directory to prepare it again"
        ) from None


class BatchLoader:
    """Global batch `step` = batch_size windows of seq_len + 1 tokens; this rank gets its contiguous
    share.

    Windows start at offset_e + j * seq_len (non-overlapping within an epoch); each epoch e draws a
    random offset in [0, seq_len) and a permutation of the windows from its own generator seeded by
    (seed, e). A batch is therefore a pure function of (seed, step): the state to save is just the
    step, a resumed run sees exactly the batches it would have seen, and no model RNG is ever
    consumed."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        if batch_size % world_size:
            raise DataError(
                f"batch size {batch_size} is not divisible by the {world_size} processes"
            )
        self.tokens, self.seq_len, self.batch_size, self.seed = tokens, seq_len, batch_size, seed
        self.rank, self.world_size = rank, world_size
        # windows that fit whatever the epoch's offset
        self.n_windows = (len(tokens) - seq_len) // seq_len
        if self.n_windows < 1:
            raise DataError(f"{len(tokens)} tokens are too few for windows of seq_len={seq_len}")
        self.step = 0
        self._epoch, self._offset, self._perm = -1, 0, np.empty(0, dtype=np.int64)

    def _epoch_order(self, epoch: int) -> tuple[int, np.ndarray]:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._offset = epoch, int(rng.integers(self.seq_len))
            self._perm = rng.permutation(self.n_windows)
        return self._offset, self._perm

    def starts(self, step: int) -> list[int]:
        """Token offsets of this rank's windows in global batch `step`."""
        per_rank = self.batch_size // self.world_size
        first = step * self.batch_size + self.rank * per_rank  # global sample index
        out = []
        for g in range(first, first + per_rank):
            offset, perm = self._epoch_order(g // self.n_windows)
            out.append(offset + int(perm[g % self.n_windows]) * self.seq_len)
        return out

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) of shape (batch_size / world_size, seq_len): y is x shifted by one token."""
        windows = np.stack(
            [self.tokens[s : s + self.seq_len + 1] for s in self.starts(step)]
        ).astype(np.int64)
        w = torch.from_numpy(windows)
        return w[:, :-1], w[:, 1:]

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.batch(self.step)
        self.step += 1
        return out

    def __iter__(self):
        return self

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
        }

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        for k in ("seed", "batch_size", "seq_len"):
            if state[k] != mine[k]:
                raise DataError(
                    f"checkpoint loader {k}={state[k]} differs from the config's {mine[k]}"
                )
        self.step = state["step"]


def eval_batches(
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int,
    max_tokens: int,
    rank: int = 0,
    world_size: int = 1,
):
    """The fixed evaluation set: the first max_tokens // seq_len consecutive windows, split across
    ranks (window i goes to rank i % world_size), as an iterator of (x, y, counts) batches of at
    most batch_size.

    Every rank gets the same number of batches, whatever the split: a sharded model's forward is a
    collective (FSDP gathers parameters, tensor parallelism exchanges activations), so a rank that
    stopped early would leave the others waiting. A rank with fewer windows pads with copies of
    window 0 that have counts=False (their loss is weighted 0). Too little data raises DataError
    here, when called, not at the first batch."""
    available = (len(tokens) - 1) // seq_len
    # 0: the whole split
    n = available if max_tokens <= 0 else min(max(1, max_tokens // seq_len), available)
    if n < 1:
        raise DataError(f"{len(tokens)} val tokens are too few for one window of seq_len={seq_len}")
    mine = list(range(rank, n, world_size))
    most = -(-n // world_size)  # rank 0 has the most windows
    n_batches = -(-most // batch_size)

    def window(j: int) -> np.ndarray:
        return tokens[j * seq_len : j * seq_len + seq_len + 1]

    def batches():
        for b in range(n_batches):
            rows = mine[b * batch_size : (b + 1) * batch_size]
            w = torch.from_numpy(np.stack([window(j) for j in (rows or [0])]).astype(np.int64))
            yield w[:, :-1], w[:, 1:], bool(rows)

    return batches()
