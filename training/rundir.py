"""A run directory: its layout (RunDir), meta.json (where and how it ran), reading and truncating
metrics.jsonl, and summary.json. A model built from a run's checkpoint is training/checkpoint.py's
load_run."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from normlab import files
from normlab.files import fsync_dir  # noqa: F401  (the run directory's writers use it)
from normlab.spikes import series, spike_score, spike_steps
from training import faults
from training.monitor import dead_gradients_at

if TYPE_CHECKING:  # torch loads where a run is made: the lab and normlab.inspect start without it
    import torch

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class RunDir:
    """The layout of a run directory, in one place: train.py writes these files, the logger, the
    study, the sample and export scripts read them.

        <out_dir>/<name>/config.yaml, meta.json, metrics.jsonl, summary.json,
                         checkpoints/latest.pt (previous.pt), .wandb_id, wandb/
        <out_dir>/.<name>.lock   (held by the process training the run)
    """

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    config = property(lambda self: self.path / "config.yaml")
    meta = property(lambda self: self.path / "meta.json")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    summary = property(lambda self: self.path / "summary.json")
    checkpoint = property(lambda self: self.path / "checkpoints" / "latest.pt")
    wandb_id = property(lambda self: self.path / ".wandb_id")
    lock = property(lambda self: self.path.parent / f".{self.path.name}.lock")

    def read_summary(self) -> dict | None:
        """summary.json, or None when the run has not written one (running, killed, failed)."""
        try:
            return json.loads(self.summary.read_text())
        except (OSError, ValueError):
            return None

    def live(self) -> bool:
        """Whether a process holds the run's lock now (training it): read from the kernel's lock
        table (/proc/locks), never by taking the lock, which would race a run starting."""
        try:
            inode = os.stat(self.lock).st_ino
            table = Path("/proc/locks").read_text()
        except OSError:  # no lock file: nothing trains it; no /proc: not known, say not live
            return False
        return any(line.split()[5].endswith(f":{inode}") for line in table.splitlines() if line)

    def status(self) -> str | None:
        return (self.read_summary() or {}).get("status")

    def records(self) -> list[dict]:
        return read_metrics(self.metrics)


def has_checkpoint(path: str | Path) -> bool:
    """A checkpoint to resume from: latest.pt / previous.pt, or a sharded run's latest.dcp /
    previous.dcp."""
    path = Path(path)
    return (
        path.is_file()
        or path.with_name(f"previous{path.suffix}").is_file()
        or any((path.with_name(f"{n}.dcp") / "extra.pt").is_file() for n in ("latest", "previous"))
    )


def git_state() -> dict:
    """The commit of this checkout and whether it has uncommitted changes (None outside git)."""
    try:
        run = lambda *a: subprocess.run(
            ["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        return {
            "commit": run("rev-parse", "HEAD"),
            "dirty": bool(run("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def run_meta(
    model: torch.nn.Module, device: torch.device, dtype: str, world_size: int, data_meta: dict
) -> dict:
    import torch

    return {
        "git": git_state(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "world_size": world_size,
        "dtype": dtype,
        "tf32": device.type == "cuda" and torch.get_float32_matmul_precision() != "highest",
        "parameters": model.num_params(),
        "non_embedding_parameters": model.num_params(non_embedding=True),
        "data": {
            k: data_meta.get(k)
            for k in (
                "source",
                "vocab_size",
                "train_tokens",
                "val_tokens",
                "unigram_entropy",
                "corpus_sha256",
            )
        },
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl (a torn last line, from a crash mid-write, is skipped)."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records after `step` (logged after the checkpoint a run resumes from), atomically."""
    keep = [r for r in read_metrics(path) if r["step"] <= step]
    write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


def spike_scores(records: list[dict], window: int, k: float) -> dict:
    """The summary's spike scores of the train loss and the gradient norm (normlab/spikes.py)."""
    return {
        "spike_score/loss": spike_score(series(records, "train/loss"), window, k),
        "spike_score/grad_norm": spike_score(series(records, "grad/norm"), window, k),
    }


def summarize(
    records: list[dict],
    *,
    status: str,
    steps_done: int,
    total_steps: int,
    diverged_at: int | None,
    unigram_entropy: float | None,
    spike_window: int,
    spike_k: float,
    wall_time_s: float,
) -> dict:
    """summary.json, derived from the run's metrics records."""
    # step 0 is L0, before any training
    val = series([r for r in records if r["step"] > 0], "val/loss")
    val_se = series([r for r in records if r["step"] > 0], "val/loss_se")
    bpb = series([r for r in records if r["step"] > 0], "val/bpb")
    init = [r.get("val/loss") for r in records if r["step"] == 0]
    # the first step pays for warm-up / compilation
    tps = sorted(series(records, "train/tokens_per_s")[1:])
    return {
        "status": status,
        "steps": steps_done,
        "total_steps": total_steps,
        "diverged_at": diverged_at,
        # every gradient below the final norm 0 from this step on
        "dead_gradients_at": dead_gradients_at(records),
        "final_val_loss": val[-1] if val and status != "diverged" else None,
        "final_val_loss_se": val_se[-1] if val_se and status != "diverged" else None,
        "best_val_loss": min(val) if val else None,
        "final_val_bpb": bpb[-1]
        if bpb and status != "diverged"
        else None,  # bits per byte (val/bpb)
        "init_val_loss": init[0] if init else None,
        "final_train_loss": (series(records, "train/loss") or [None])[-1],
        "unigram_entropy": unigram_entropy,
        **spike_scores(records, spike_window, spike_k),
        # the steps behind the scores (normlab.inspect marks them)
        "spikes/loss": spike_steps(records, "train/loss", spike_window, spike_k),
        "spikes/grad_norm": spike_steps(records, "grad/norm", spike_window, spike_k),
        "spike_window": spike_window,
        "spike_k": spike_k,
        "tokens_per_s": tps[len(tps) // 2] if tps else None,  # median over steps
        "wall_time_s": round(wall_time_s, 2),
        **(
            {"mfu": mfu[len(mfu) // 2]} if (mfu := sorted(series(records, "train/mfu")[1:])) else {}
        ),  # GPUs only
    }


def write_text(path: Path, text: str) -> None:
    """Replace a file atomically and durably (normlab/files.py's rule, with the fault tests' write
    point before the rename)."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    """write_text's rule for bytes."""
    files.write_bytes(path, data, before_rename=_write_point)


def replacing(path: Path):
    """A temporary path beside `path` for a writer that wants a file name (savefig, torch.save),
    renamed onto it when the block ends (normlab/files.py's rule, with the write fault point)."""
    return files.replacing(path, before_rename=_write_point)


def _write_point() -> None:
    faults.point("write")  # the new file complete, not yet in place


def storage_error(e: BaseException) -> OSError | None:
    """The OSError behind an error (normlab/files.py os_error), or None."""
    return files.os_error(e)


def unwritten(path, e: BaseException) -> str | None:
    """The one line for an output a storage fault left unwritten (a tool that builds its output
    beside it and renames it whole: nothing is left there), or None when e is no storage fault
    (libraries such as safetensors wrap a full disk's error in their own)."""
    from training.errors import storage_fault

    err = storage_fault(e)
    if err is None:
        return None
    return f"error: cannot write {path}: {err.strerror or err}; nothing was left there"


def read_json(path: Path):
    """A JSON file's content; ValueError naming the file, line and fault when it is not JSON (a
    truncated write by another tool, a hand edit)."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not valid JSON (not UTF-8 text)") from None


def write_json(path: Path, obj: dict) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")
