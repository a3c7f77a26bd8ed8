"""The config schema (dataclasses) and load_config: defaults < YAML file(s) < command-line
overrides; what a --resume may change (resumed_config).

A YAML file may start with `base: other.yaml` (relative to itself) to be a small diff on another
file. Unknown keys, wrong types and invalid choices raise ConfigError with one line saying what is
allowed."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import io
import math
from dataclasses import dataclass, field
from functools import cache, lru_cache, reduce
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from model.args import ModelArgs, ranged


class ConfigError(ValueError):
    """Bad config or command line: the message is the one line the user sees."""


@dataclass
class DataConfig:
    source: str = (
        "pydocs"  # pydocs | pystdlib | text:PATH_OR_GLOB | hf:NAME[:CONFIG][@SPLIT][#REVISION]
    )
    vocab_size: int = ranged(4096, ">= 1")  # SentencePiece vocabulary; also sets model.vocab_size
    val_fraction: float = ranged(0.05, "(0, 1)")  # share of documents held out for validation
    seed: int = ranged(1337, ">= 0")  # train/val document split
    text_field: str = "text"
    root: str = "data/prepared"
    # cap the training split at this many tokens (a hub source is streamed); 0 = all
    max_tokens: int = ranged(0, ">= 0")


@dataclass
class OptimConfig:
    lr: float = ranged(3e-3, "> 0")  # peak learning rate
    # every LR x this, optim.lr kept as named (the lab's known-effect control)
    lr_factor: float = ranged(1.0, "> 0")
    schedule: str = "cosine"  # cosine | linear | constant (after warmup)
    warmup_steps: int = ranged(30, ">= 0")
    # > 0: warmup_steps = this x the schedule's steps (rounded)
    warmup_fraction: float = ranged(0.0, "[0, 1)")
    # the schedule's horizon; 0 = train.steps. Kept when a resumed run is extended
    schedule_steps: int = ranged(0, ">= 0")
    min_lr_ratio: float = ranged(0.1, "[0, 1]")  # final lr = lr * min_lr_ratio
    beta1: float = ranged(0.9, "[0, 1)")
    beta2: float = ranged(0.95, "[0, 1)")
    eps: float = ranged(1e-8, ">= 0")
    weight_decay: float = ranged(0.1, ">= 0")  # on matrices only, never on norm gains or biases
    weight_decay_mode: str = (
        "coupled"  # coupled: decay wd * lr(t) (torch's AdamW) | independent: wd * lr(t) / lr
    )
    parametrization: str = (
        "sp"  # sp | mup_simple: every matrix's LR x mup_base_width / model.dim (training/optim.py)
    )
    # mup_simple's base width: the width whose LRs are the configured ones
    mup_base_width: int = ranged(64, ">= 1")
    decay_embeddings: bool = False  # also decay the token embedding (and a tied output head)
    # max global L2 norm; 0 disables clipping (the norm is still logged)
    grad_clip: float = ranged(1.0, ">= 0")
    # stability controls (training/controls.py), all off by default
    update_clip: bool = False  # StableAdamW: each tensor's step / max(1, RMS_t)
    # > 0: skip an update whose loss or grad norm z-score exceeds it
    skip_step_sigma: float = ranged(0.0, ">= 0")
    # ... over the last this many steps (OLMo-core: 6 sigma, 128)
    skip_step_window: int = ranged(128, ">= 2")
    # > 0: QK-Clip, a head's logits scaled back to this max (Kimi K2: 100)
    qk_clip_tau: float = ranged(0.0, ">= 0")


@dataclass
class TrainConfig:
    steps: int = ranged(300, ">= 1")  # optimizer steps
    batch_size: int = ranged(32, ">= 1")  # sequences per optimizer step, summed over all processes
    # sequences per forward pass and process; 0 = no gradient accumulation
    micro_batch_size: int = ranged(0, ">= 0")
    seq_len: int = ranged(128, ">= 1")  # tokens per sequence; also sets model.max_seq_len
    seed: int = ranged(0, ">= 0")  # model init and batch order (separate generators)
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "float32"  # float32 | bfloat16 | float16 (autocast; float16 with a GradScaler)
    compile: bool = False  # torch.compile the model
    # over torchrun processes: ddp | fsdp (FSDP2) | tp (tensor parallel x FSDP2 over data)
    parallel: str = "ddp"
    # train.parallel=tp: ranks per tensor-parallel group (must divide the process count)
    tp_size: int = ranged(2, ">= 1")
    # coefficient of mean(logsumexp(logits)^2) (PaLM); 0 disables
    z_loss: float = ranged(0.0, ">= 0")
    eval_every: int = ranged(50, ">= 1")  # steps between validation evals (and always at the end)
    # fixed validation budget: the first eval_tokens tokens of val.bin; 0 = all of it
    eval_tokens: int = ranged(16384, ">= 0")
    # steps between checkpoints (and always at the end); 0 = only at the end
    checkpoint_every: int = ranged(100, ">= 0")
    # end this session after this step, resumable (for time-sliced jobs); 0 = off
    stop_at: int = ranged(0, ">= 0")
    # torch CPU threads per process; 0 = torch's default, capped at free cores
    threads: int = ranged(0, ">= 0")
    malloc_tuning: bool = True  # CPU: keep freed memory in glibc's heap (see training/cpu.py)
    memory_check: bool = (
        True  # refuse a run whose memory estimate exceeds what the machine has (training/memory.py)
    )
    sample_tokens: int = ranged(48, ">= 0")  # tokens of text generated at the end (0 = none)


@dataclass
class LogConfig:
    out_dir: str = "runs"  # runs/<name>/
    name: str = ""  # run name; empty = <config>-<norm>-<placement>
    stats_every: int = ranged(25, ">= 0")  # steps between per-layer stability metrics (0 = never)
    wandb: str = "disabled"  # disabled | offline | online
    wandb_project: str = "normlab"
    tensorboard: bool = True  # TensorBoard event files in the run directory (tensorboard --logdir)
    # spike detector: a value is compared with the median of the previous spike_window
    spike_window: int = ranged(5, ">= 2")
    # ...and is a spike >= spike_k robust std above it (normlab/spikes.py; OLMo 2: 7)
    spike_k: float = ranged(5.0, "> 0")
    # nats: a run whose evals never got this far below the unigram entropy is a plateau
    plateau_margin: float = ranged(0.25, ">= 0")
    # x the run's steps: a plateau whose last evals would not cross that soon collapsed
    flat_horizon: float = ranged(1.0, "> 0")
    # nats: a run that learned and ended this far above its best val loss is unstable
    blowup_margin: float = ranged(0.5, "> 0")


@dataclass
class Config:
    model: ModelArgs = field(default_factory=ModelArgs)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)


CHOICES = {
    "train.device": ("auto", "cpu", "cuda"),
    "train.dtype": ("float32", "bfloat16", "float16"),
    "train.parallel": ("ddp", "fsdp", "tp"),
    "optim.schedule": ("cosine", "linear", "constant"),
    "log.wandb": ("disabled", "offline", "online"),
}


@lru_cache(maxsize=256)
def _parse(text: str) -> tuple:
    """A config file's text as (its node less `base`, its `base`), parsed once per text (a study
    loads one file for each of its runs); the node is read-only: merge() reads it, never changes
    it."""
    node = OmegaConf.load(io.StringIO(text))
    base = node.pop("base", None) if OmegaConf.is_dict(node) else None
    OmegaConf.set_readonly(node, True)
    return node, base


def _load_yaml(path: Path, seen: tuple = ()):
    if path.is_dir():
        raise ConfigError(f"config {str(path)!r} is not a file (a directory); give a YAML file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"config {str(path)!r} is not a regular file; give a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.resolve() in seen:
        raise ConfigError(f"config {str(path)!r} includes itself through 'base'")
    try:
        text = path.read_text(encoding="utf-8")
        node, base = _parse(text)
    except yaml.MarkedYAMLError as e:  # file:line:column of the fault, then what it is
        mark, ctx = e.problem_mark or e.context_mark, e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        started = f" ({e.context} at line {ctx.line + 1})" if e.context and ctx else ""
        raise ConfigError(
            f"{where}: YAML syntax error: {e.problem or e.context}{started}"
        ) from None
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "Invalid loaded object type" in msg:  # a bare scalar
            raise ConfigError(
                f"config {str(path)!r} must be a mapping of sections (model:, data:, optim:, "
                f"train:, log:), got a {msg.rsplit(' ', 1)[-1]}"
            ) from None
        raise ConfigError(f"cannot parse {str(path)!r}: {msg}") from None
    if not OmegaConf.is_dict(node):
        raise ConfigError(
            f"config {str(path)!r} must be a mapping of sections (model:, data:, optim:, train:, "
            f"log:), got a list"
        )
    sections = {f.name for f in dataclasses.fields(Config)}
    for key, value in node.items():
        if key in sections and not OmegaConf.is_dict(value) and value is not None:
            raise ConfigError(
                f"config {str(path)!r}: {key!r} must be a mapping of its fields, e.g. "
                f"{key}: {{...}}, got {value!r}"
            )
    if base is None:
        return [text]
    return _load_yaml(path.parent / base, seen + (path.resolve(),)) + [text]


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple = (), values: dict | None = None
) -> Config:
    """Config from defaults, then the YAML file (and its bases), then `key=value` overrides (parsed
    as YAML), then `values` ({dotted key: value}, taken as given: --name on stays the string
    'on'); validated."""
    return validate(merge_config(path, overrides, values))


@cache
def _schema():
    """The defaults as an OmegaConf node, built once: merge() copies it, never changes it (building
    it is half of a load_config, which a study makes for every run)."""
    return OmegaConf.structured(Config)


def merge_config(
    path: str | Path | None = None, overrides: list[str] | tuple = (), values: dict | None = None
) -> Config:
    """load_config's layers merged, not yet validated: its errors (a missing file, bad YAML, an
    unknown key, a wrong type) come before torch is imported. The texts of the file and its bases
    are read on every call; the merge of the same texts and overrides is made once a process (a
    study loads a config for each of its runs: most of the cost is OmegaConf's merge)."""
    texts = tuple(_load_yaml(Path(path))) if path else ()
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"expected key=value overrides (e.g. optim.lr=3e-3), got {bad[0]!r}")
    # repr: 1, 1.0 and True are equal keys but different values
    key = (texts, tuple(overrides), tuple((k, repr(v)) for k, v in (values or {}).items()))
    cfg = _MERGED.get(key)  # one lookup: the sweep's threads may clear it in between
    if cfg is None:
        cfg = _merge(texts, overrides, values)
        if len(_MERGED) >= 4096:
            _MERGED.clear()
        _MERGED[key] = cfg
    return copy.deepcopy(cfg)  # validate() and callers change their copy


_MERGED: dict[tuple, Config] = {}


def _merge(texts: tuple[str, ...], overrides, values: dict | None) -> Config:
    layers = [_schema(), *(_parse(text)[0] for text in texts)]
    try:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        exact = OmegaConf.create()
        for key, value in (values or {}).items():
            OmegaConf.update(exact, key, value)
        layers.append(exact)
        cfg = OmegaConf.to_object(OmegaConf.merge(*layers))
        given = OmegaConf.to_container(OmegaConf.merge(*layers[1:])) if layers[1:] else {}
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    check_numbers(cfg)
    check_derived(cfg, flat(given))
    return cfg


# fields other sections set (validate): one given explicitly must agree, never be overridden
DERIVED_FROM = {"model.max_seq_len": "train.seq_len", "model.vocab_size": "data.vocab_size"}


def check_derived(cfg: Config, given: dict) -> None:
    """ConfigError where a config gives a derived field (DERIVED_FROM) a value its source does not
    have: it would be replaced without a word."""
    for key, source in DERIVED_FROM.items():
        if key in given:
            value, want = (
                reduce(getattr, key.split("."), cfg),
                reduce(getattr, source.split("."), cfg),
            )
            if value != want:
                raise ConfigError(
                    f"{key}={value} differs from {source}={want}: {key} is set from {source} "
                    f"(one source of truth); set {source} instead"
                )


def check_numbers(cfg: Config) -> None:
    """Every number of the config under check_number's rule, in the range its field declares."""
    for key, value, kind, spec in _numbers(cfg):
        if value is not None:  # an optional field left unset
            check_number(key, value, kind, spec)


def _one_line(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", "") or ""
    msg = str(getattr(e, "msg", "") or e).splitlines()[0]
    if "not in" in msg and key:
        section = key.rsplit(".", 1)[0] if "." in key else ""
        node = OmegaConf.select(_schema(), section) if section else _schema()
        keys = [str(k) for k in node.keys()] if OmegaConf.is_dict(node) else []
        close = difflib.get_close_matches(key.rsplit(".", 1)[-1], keys, n=1, cutoff=0.6)
        hint = f"did you mean {section + '.' if section else ''}{close[0]}? " if close else ""
        where = f" in {section}" if section else ""
        return f"unknown config key {key!r}; {hint}valid keys{where}: {', '.join(keys)}"
    return f"bad value for {key}: {msg}" if key else msg


def in_range(value: float, spec: str) -> bool:
    """Whether a number is in a range written as '> 0', '>= 1', '[0, 1)', '(0, 1)' or 'any'."""
    if spec == "any":
        return True
    if spec[0] in "[(":
        lo, hi = (float(x) for x in spec[1:-1].split(","))
        above = value >= lo if spec[0] == "[" else value > lo
        return above and (value <= hi if spec[-1] == "]" else value < hi)
    op, bound = spec.split()
    return value >= float(bound) if op == ">=" else value > float(bound)


def check_number(key: str, value, kind: type, spec: str) -> None:
    """ConfigError unless `value` is a finite number of `kind` (an int is a float; a bool is
    neither) in `spec`'s range: the one rule for every number a user sets."""
    what = "an integer" if kind is int else "a finite number"
    wanted = what if spec == "any" else f"{what} {'in ' if spec[0] in '[(' else ''}{spec}"
    ok_type = not isinstance(value, bool) and (
        isinstance(value, int) if kind is int else isinstance(value, int | float)
    )
    if not ok_type or not math.isfinite(value) or not in_range(value, spec):
        raise ConfigError(f"{key}={value!r} must be {wanted}")


def number(kind: type, spec: str, name: str = "the value"):
    """check_number as an argparse type: a tool's argument under the same rule, said in one line."""

    def parse(text: str):
        try:
            value = kind(text) if kind is int else float(text)
        except ValueError:
            value = text
        try:
            check_number(name, value, kind, spec)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e).split("=", 1)[1]) from None
        return value

    parse.__name__ = "integer" if kind is int else "number"
    return parse


def _numbers(cfg, cls=None, prefix: str = ""):
    """(dotted key, value, declared kind, declared range or None) of every int or float field of a
    config section."""
    cls = cls or type(cfg)
    for f in dataclasses.fields(cls):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _numbers(value, type(value), f"{prefix}{f.name}.")
            continue
        kind = str(f.type).replace(" ", "")
        base = kind.split("|")[0]
        if base in ("int", "float"):
            kind = int if base == "int" else float
            yield f"{prefix}{f.name}", value, kind, f.metadata.get("range")


def validate(cfg: Config) -> Config:
    """Check choices and ranges, and derive the fields other sections determine."""
    from data.sources import DataError, parse_source
    from model.args import RESIDUAL_INITS
    from model.blocks import BLOCKS
    from model.ffn import FFNS
    from model.norm_config import NORM_IMPLS, NORMS, check_options
    from model.norms import NORM_PRECISIONS
    from model.ops import OPS_IMPLS
    from training.optim import PARAMETRIZATIONS, WEIGHT_DECAY_MODES

    check_numbers(cfg)
    choices = {
        **CHOICES,
        "model.norm": tuple(NORMS),
        "model.placement": tuple(BLOCKS),
        "model.norm_impl": tuple(NORM_IMPLS),
        "model.ops_impl": tuple(OPS_IMPLS),
        "model.init_residual": tuple(RESIDUAL_INITS),
        "model.norm_precision": tuple(NORM_PRECISIONS),
        "model.ffn": tuple(FFNS),
        "optim.weight_decay_mode": tuple(WEIGHT_DECAY_MODES),
        "optim.parametrization": tuple(PARAMETRIZATIONS),
    }
    for key, valid in choices.items():
        value = reduce(getattr, key.split("."), cfg)
        if value not in valid:
            raise ConfigError(f"{key}={value!r} is not one of: {', '.join(sorted(valid))}")
    try:
        parse_source(cfg.data.source)
    except DataError as e:
        raise ConfigError(f"data.source: {e}") from None
    # single sources of truth: the tokenizer sets the vocabulary, the training sequence length the
    # context
    cfg.model.vocab_size = cfg.data.vocab_size
    cfg.model.max_seq_len = cfg.train.seq_len
    t = cfg.train
    if t.micro_batch_size and t.batch_size % t.micro_batch_size:
        raise ConfigError(
            f"train.batch_size={t.batch_size} must be a multiple of "
            f"train.micro_batch_size={t.micro_batch_size}"
        )
    o = cfg.optim
    if (o.update_clip or o.qk_clip_tau) and t.parallel != "ddp":
        raise ConfigError(
            "optim.update_clip and optim.qk_clip_tau act on whole parameters: they run with "
            f"train.parallel=ddp, got {t.parallel}"
        )
    # resolved once, recorded in config.yaml: a resume keeps it
    o.schedule_steps = o.schedule_steps or t.steps
    if o.warmup_fraction:  # a recipe's share of the budget, carried to any budget (issue 61)
        o.warmup_steps = round(o.warmup_fraction * o.schedule_steps)
    if o.warmup_steps >= o.schedule_steps:  # it would never reach optim.lr: 10%, as the recipes
        o.warmup_steps = o.schedule_steps // 10  # (train.py says so in one line)
    if t.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "train.device=cuda but no CUDA device is available; use train.device=auto or cpu"
            )
    try:
        cfg.model.check()
        check_options(cfg.model.norm_options)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg


def flat(d: dict, prefix: str = "") -> dict:
    """{'train': {'steps': 5}} -> {'train.steps': 5}: a nested config dict keyed by dotted field
    names."""
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def to_yaml(cfg: Config) -> str:
    """The config as YAML, strings quoted where OmegaConf would read them as numbers ('1e-3'); from
    the plain dict: the same text as from the structured config, in half the time."""
    return OmegaConf.to_yaml(to_dict(cfg))


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


# what a resumed run may change: its length and how it runs, not what it trains
RESUMABLE = (
    "train.steps",
    "optim.schedule_steps",
    "train.stop_at",
    "train.checkpoint_every",
    "train.eval_every",
    "train.threads",
    "train.malloc_tuning",
    "train.memory_check",
    "train.sample_tokens",
    "log.out_dir",
    "log.wandb",
    "log.wandb_project",
    # how it is spread over processes (a resume on another count splits the same batch)
    "train.parallel",
    "train.tp_size",
    "train.micro_batch_size",
)


def resumed_config(saved: Path, given: Config | None, overrides: list[str], flags: dict) -> Config:
    """The saved config with the allowed changes of a --resume. A --config given again (a scheduler
    relaunching the same command) must agree with the saved run on everything outside RESUMABLE."""
    changed = [o.split("=", 1)[0] for o in overrides] + [k for k in flags if k != "log.name"]
    if given is not None:
        before, now = flat(to_dict(load_config(saved))), flat(to_dict(given))
        differ = [
            k for k in now if k not in RESUMABLE and k != "log.name" and now[k] != before.get(k)
        ]
        if differ:
            raise ConfigError(
                f"--resume: the command's config differs from the saved {saved} in "
                f"{differ[0]} ({before.get(differ[0])!r} -> {now[differ[0]]!r}); a "
                f"resume may change only: {', '.join(RESUMABLE)}"
            )
        changed = [k for k in changed if k in RESUMABLE]  # the others were just checked equal
    fixed = [k for k in changed if k not in RESUMABLE]
    if fixed:
        raise ConfigError(
            f"--resume cannot change {fixed[0]}; it may change: {', '.join(RESUMABLE)}"
        )
    flags = dict(flags)
    if "optim.schedule_steps" not in changed:  # the run's scheduled horizon (older runs: its steps)
        flags["optim.schedule_steps"] = load_config(saved).optim.schedule_steps
    return load_config(saved, [o for o in overrides if o.split("=", 1)[0] in changed], flags)
