"""A monitored run as the inspect page reads it, from any of the folders the monitor writes: a
normlab run (runs/<name>/: config.yaml, metrics.jsonl, summary.json), a Monitor's `out` folder
(metrics.jsonl, summary.json), a transformers Trainer's output folder (normlab/metrics.jsonl from
the callback, or else its TensorBoard event files), or any folder of TensorBoard event files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from normlab.files import read_records
from normlab.spikes import spike_steps

# TensorBoard tags of the hosts' own scalars, in normlab's names (transformers' reporter prefixes
# train/ to every training log key, eval/ to the eval ones)
TAGS = {
    "train/loss": "train/loss",
    "train/grad_norm": "grad/norm",
    "train/learning_rate": "train/lr",
    "eval/loss": "val/loss",
    "train_loss": "train/loss",
    "val_loss": "val/loss",
}
# the monitor's own key families (a host may have prefixed them with train/)
FAMILIES = ("grad/", "update/", "param/", "act/", "norm_in/", "norm/", "attn/", "logits/", "dyt/")


@dataclass
class MonitoredRun:
    name: str
    path: Path
    records: list[dict]
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # flattened {"model.norm": ...}; {} if none
    source: str = "metrics.jsonl"

    def points(self, key: str) -> tuple[list[int], list[float]]:
        rows = [(r["step"], r[key]) for r in self.records if r.get(key) is not None]
        return [s for s, _ in rows], [v for _, v in rows]

    def spikes(self, key: str) -> list[int]:
        """The steps the summary lists as spikes of `key` (loss, grad_norm), else detected now."""
        listed = self.summary.get(f"spikes/{key}")
        if listed is not None:
            return list(listed)
        window = int(self.config.get("log.spike_window", self.summary.get("spike_window", 5)))
        k = float(self.config.get("log.spike_k", self.summary.get("spike_k", 5.0)))
        metric = {"loss": "train/loss", "grad_norm": "grad/norm"}[key]
        return spike_steps(self.records, metric, window, k)


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config(path: Path) -> dict:
    """config.yaml flattened; {} without one or without a YAML reader; ValueError when damaged."""
    file = path / "config.yaml"
    if not file.is_file():
        return {}
    try:
        import yaml
    except ImportError:
        return {}
    try:
        data = yaml.safe_load(file.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{file} is not YAML ({line}): fix it or restore it") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{file} is not a mapping of config sections")
    return flat(data)


def _summary(path: Path) -> dict:
    file = path / "summary.json"
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{file} is not JSON ({e}): move it away to read the run without it"
        ) from None
    return data if isinstance(data, dict) else {}


def event_files(path: Path) -> list[Path]:
    return sorted(path.rglob("events.out.tfevents.*"))


def tensorboard_records(path: Path) -> list[dict]:
    """Every scalar of the TensorBoard event files under `path`, as records by step in normlab's
    names (a later file's value wins at a step both have)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ValueError(
            f"{path}: reading TensorBoard event files needs the tensorboard package (pip install "
            "tensorboard)"
        ) from None
    by_step: dict[int, dict] = {}
    for folder in sorted({f.parent for f in event_files(path)}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            key = _key(tag)
            for event in acc.Scalars(tag):
                by_step.setdefault(int(event.step), {})[key] = float(event.value)
    return [{"step": s, **by_step[s]} for s in sorted(by_step)]


def _key(tag: str) -> str:
    if tag in TAGS:
        return TAGS[tag]
    bare = tag.removeprefix("train/")
    return bare if bare.startswith(FAMILIES) else tag


def read_run(path: str | Path) -> MonitoredRun:
    """The monitored run in folder `path` (module docstring); ValueError (one line) when it holds
    none."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: no such folder")
    for folder, source in ((path, "metrics.jsonl"), (path / "normlab", "normlab/metrics.jsonl")):
        if (folder / "metrics.jsonl").is_file():
            name = path.name if folder == path else f"{path.name}"
            return MonitoredRun(
                name,
                path,
                read_records(folder / "metrics.jsonl"),
                _summary(folder),
                _config(folder),
                source,
            )
    if event_files(path):
        return MonitoredRun(path.name, path, tensorboard_records(path), source="TensorBoard events")
    raise ValueError(
        f"{path}: no monitored run here (no metrics.jsonl, normlab/metrics.jsonl or TensorBoard "
        "event files)"
    )
