"""The study file, the first stage of a study (define -> run -> read -> analyse -> render): its
schema (what it asks, the grid, the protocol's settings, the claims of the literature and the ones
withdrawn), validated before anything runs, and the grid expanded into run specs (name, overrides),
each run's config checked up front.

A study file lives in lab/studies/<name>.yaml: its file name, its `name:` and its results folder
(lab/results/<name>/) are one name. Its `config:` is a training config: a path relative to the
study file, or the name of a file in configs/train/ (so a copy of the study file kept beside its
results still reads)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from training.config import ConfigError, check_number, load_config, ranged

DEFAULT_MARGIN = 0.02  # nats: the equivalence margin when the study file does not set one

ALIASES = {
    "norm": "model.norm",
    "placement": "model.placement",
    "lr": "optim.lr",
    "seed": "train.seed",
    "seeds": "train.seed",
}


TRAIN_CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "train"
STUDY_KEYS = {
    "name",
    "about",
    "config",
    "failure",
    "sensitivity_margin",
    "ratio_margin",
    "overrides",
    "grid",
    "exclude",
    "threads_per_worker",
    "workers",
    "equivalence_margin",
    "margin_reason",
    "protocol",
    "claims",
    "withdrawn",
    "quick",
    "expected",
    "history",
    "multiples",
    "slurm",
}


SLURM_KEYS = {"partition", "time_min", "cpus_per_run", "gpus_per_run", "array_parallelism"}


def _slurm(section, where: str) -> None:
    """The study file's `slurm:` (python -m lab.sweep --executor slurm; flags override it)."""
    if not isinstance(section, dict) or set(section) - SLURM_KEYS:
        raise ConfigError(f"{where}: slurm is a mapping of {', '.join(sorted(SLURM_KEYS))}")
    for key in SLURM_KEYS - {"partition"}:
        if key in section:
            check_number(f"{where}: slurm.{key}", section[key], int, ">= 1")
    if "partition" in section and not isinstance(section["partition"], str):
        raise ConfigError(f"{where}: slurm.partition is a partition's name")


def _once(values: list, where: str) -> None:
    """ConfigError naming a value a list gives twice (its runs would be one run, or a seed's pair
    its own): checked when the study is read, before any run."""
    seen = set()
    for v in values:
        key = repr(v)
        if key in seen:
            raise ConfigError(f"{where} lists {v!r} twice; each value once")
        seen.add(key)


def in_range(cls, name: str, value, prefix: str) -> None:
    """ConfigError unless `value` (a number, or each number of a list) lies in the range declared
    beside field `name` of `cls`; the message names `prefix` + the key."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    kind = int if f.type.startswith(("int", "tuple[int")) else float
    if isinstance(value, list | tuple):
        for v in value:
            check_number(f"{prefix}{name}[]", v, kind, f.metadata["range"])
    else:
        check_number(f"{prefix}{name}", value, kind, f.metadata["range"])


def check_ranges(cls, section: dict, prefix: str) -> None:
    """Every number `section` sets for a field of `cls` with a declared range, in that range (null:
    unset, or a criterion turned off)."""
    for f in dataclasses.fields(cls):
        if "range" in f.metadata and section.get(f.name) is not None:
            in_range(cls, f.name, section[f.name], prefix)


def train_config(study_path: Path, name: str) -> str:
    """The training config a study file names: relative to the study file, else in
    configs/train/."""
    for base in (study_path.parent, TRAIN_CONFIGS):
        if (base / name).is_file():
            return str((base / name).resolve())
    raise ConfigError(
        f"{study_path}: config {name!r} does not exist beside the study file or in {TRAIN_CONFIGS}"
    )


def load_study(path: Path) -> Study:
    """The study file parsed and checked into a Study (the grid's keys resolved to dotted config
    fields); ConfigError in one line naming the key."""
    if not path.is_file():
        raise ConfigError(f"study file {str(path)!r} does not exist")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:
        raise ConfigError(f"cannot parse {str(path)!r}: {str(e).strip().splitlines()[0]}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("grid"), dict):
        raise ConfigError(
            f"{path}: a study is a mapping with a 'grid' mapping of config fields to value lists"
        )
    unknown = set(raw) - STUDY_KEYS
    if unknown:
        raise ConfigError(
            f"unknown study key(s) {', '.join(sorted(unknown))}; valid: "
            f"{', '.join(sorted(STUDY_KEYS))}"
        )
    if not raw.get("grid"):
        raise ConfigError(f"{path}: a study needs a non-empty 'grid'")
    grid = {}
    for key, values in raw["grid"].items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key} must be a non-empty list of values")
        _once(values, f"{path}: grid.{key}")
        grid[ALIASES.get(key, key)] = values
    check_ranges(Study, raw, f"{path}: ")
    protocol = None
    if "protocol" in raw:
        if "optim.lr" not in grid or "train.seed" in grid:
            raise ConfigError(
                f"{path}: a study with a protocol has an lr axis and no seed axis in its grid (the "
                f"protocol's seeds replace it)"
            )
        protocol = parse_protocol(raw["protocol"], str(path))
    if raw.get("slurm") is not None:
        _slurm(raw["slurm"], str(path))
    multiples = raw.get("multiples")
    if multiples is not None:
        multiples = parse_multiples(multiples, grid, str(path))
    rule, alternatives = parse_failure(raw.get("failure"), str(path))
    withdrawn = raw.get("withdrawn") or []
    if not isinstance(withdrawn, list) or any(
        not isinstance(w, dict) or set(w) != {"paper", "says", "why"} for w in withdrawn
    ):
        raise ConfigError(
            f"{path}: withdrawn is a list of {{paper, says, why}}: a claim this setup cannot test "
            "as "
            f"the paper states it, and why"
        )
    if not isinstance(raw.get("history") or [], list):
        raise ConfigError(
            f"{path}: history is a list of notes (what changed after results, and when)"
        )
    quick = raw.get("quick")
    if quick is not None and (
        not isinstance(quick, dict) or set(quick) - {"config", "overrides", "grid"}
    ):
        raise ConfigError(
            f"{path}: quick must be a mapping with config, overrides and/or grid (what --quick "
            "replaces)"
        )
    given = {k: v for k, v in raw.items() if k in GIVEN_AS_WRITTEN}
    return Study(
        name=raw.get("name") or path.stem,
        config=train_config(path, raw.get("config", "default.yaml")),
        dir=str(path.parent.resolve()),
        grid=grid,
        about=str(raw.get("about") or ""),
        exclude=_exclude(path, raw.get("exclude"), grid),
        protocol=protocol,
        rule=rule,
        alternatives=alternatives,
        claims=[_claim(path, i, c, grid) for i, c in enumerate(raw.get("claims") or [])],
        withdrawn=withdrawn,
        quick=quick,
        multiples=multiples,
        **given,
        history=list(raw.get("history") or []),
        written=frozenset(raw) - {"quick"},
    )


def _exclude(path: Path, section, grid: dict) -> list[dict]:
    """The study file's `exclude:`, grid combinations that are not run: a list of {field: value}
    (grid fields other than lr and seed, values of the grid), each dropping every combination that
    has all of its values. Arms whose fields go together (DyT with its recipe's embedding scalar,
    RMSNorm without) are a grid minus exclusions; a claim between such arms names every field they
    differ in (the fields a claim leaves out are equal in its two arms)."""
    if section is None:
        return []
    where = f"{path}: exclude"
    if not isinstance(section, list) or any(not isinstance(e, dict) or not e for e in section):
        raise ConfigError(
            f"{where} is a list of mappings of grid fields to values (the combinations not run)"
        )
    out = []
    for e in section:
        entry = {ALIASES.get(k, k): v for k, v in e.items()}
        for key, value in entry.items():
            if key in ("optim.lr", "train.seed") or key not in grid or value not in grid[key]:
                raise ConfigError(
                    f"{where}: {key}={value!r} is not a value of the grid (arms are grid values "
                    "other "
                    f"than lr and seed)"
                )
        out.append(entry)
    return out


@dataclass(frozen=True)
class Multiples:
    """`multiples:` loss at fixed multiples of each arm's best LR (docs/METHODS.md): every arm runs
    at its best LR (`best_lr`, chosen before this study on other seeds: `chosen` says where) times
    each of `factors`, on the grid's seeds; arms are paired by seed at each factor."""

    factors: tuple[float, ...] = field(metadata={"range": "> 0"})
    best_lr: tuple  # ((fields, lr), ...): the arms whose grid values include all the fields
    chosen: str
    # the pre-registered pairs, compared at each factor (lab/multiples.py): Pair, ...; added after
    # the first multiples study's runs (lab/design.py leaves it out of a design while it is empty)
    compare: tuple = field(default=(), metadata={"added": "issue 76"})

    def lr(self, combination: dict) -> float:
        """The best LR of the arm a grid combination belongs to (exactly one entry matches)."""
        hits = [lr for fields, lr in self.best_lr if _matches(fields, combination)]
        if len(hits) != 1:
            raise ConfigError(
                f"multiples.best_lr: {len(hits)} entries match the arm {combination} (one must)"
            )
        return hits[0]

    def factor(self, best: float, lr: float) -> float:
        """Which of the factors a run's LR is (its LR was written to 3 significant figures)."""
        return min(self.factors, key=lambda f: abs(math.log(lr / (best * f))))


ROLES = ("test", "yardstick", "control", "check")


@dataclass(frozen=True)
class Pair:
    """multiples.compare[]: arm a against arm b at every factor, paired by seed. Each side names
    grid values; a field it leaves out is the grid's first value. role: test (in the Holm family:
    its mean by TOST or rank test, its spread against its yardstick's), yardstick (two identical
    computations), control (a known difference the instrument must see), check (reported)."""

    name: str
    a: tuple  # ((field, value), ...)
    b: tuple
    role: str = "check"
    yardstick: str | None = None  # a test's: the name of the yardstick pair


def _matches(fields: dict, combination: dict) -> bool:
    return all(k in combination and combination[k] == v for k, v in fields.items())


def multiple_lr(best: float, factor: float) -> float:
    """A run's LR at `factor` x its arm's best LR, to 3 significant figures (its name reads it)."""
    return float(f"{best * factor:.3g}")


def parse_multiples(section, grid: dict, where: str) -> Multiples | None:
    """The study file's `multiples:` section (None without one); ConfigError on anything else."""
    if section is None:
        return None
    if (
        not isinstance(section, dict)
        or not {"factors", "best_lr", "chosen"} <= set(section)
        or (set(section) - {"factors", "best_lr", "chosen", "compare"})
    ):
        raise ConfigError(
            f"{where}: multiples is a mapping of factors (a list), best_lr (a list of grid fields "
            "with an lr), chosen (where the best LRs were chosen) and optionally compare (pairs)"
        )
    if "optim.lr" in grid or "train.seed" not in grid:
        raise ConfigError(
            f"{where}: a study with multiples has a seed axis and no lr axis in its grid (each "
            "arm's LR is its best_lr times a factor)"
        )
    factors = section["factors"]
    if not isinstance(factors, list) or not factors:
        raise ConfigError(f"{where}: multiples.factors must be a non-empty list of numbers > 0")
    in_range(Multiples, "factors", factors, f"{where}: multiples.")
    if len(set(factors)) != len(factors):
        raise ConfigError(f"{where}: multiples.factors lists a factor twice")
    entries = section["best_lr"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: multiples.best_lr must be a non-empty list")
    best = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "lr" not in e:
            raise ConfigError(f"{where}: multiples.best_lr[{i}] is a mapping of grid fields and lr")
        check_number(f"{where}: multiples.best_lr[{i}].lr", e["lr"], float, "> 0")
        fields = {ALIASES.get(k, k): v for k, v in e.items() if k != "lr"}
        for key, value in fields.items():
            if key not in grid or value not in grid[key] or key == "train.seed":
                raise ConfigError(
                    f"{where}: multiples.best_lr[{i}]: {key}={value!r} is not a value of the grid"
                )
        best.append((fields, float(e["lr"])))
    pairs = tuple(_pair(p, i, grid, where) for i, p in enumerate(section.get("compare") or []))
    names = [p.name for p in pairs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: multiples.compare names a pair twice")
    for p in pairs:
        if p.role == "test" and p.yardstick not in [q.name for q in pairs if q.role == "yardstick"]:
            raise ConfigError(
                f"{where}: multiples.compare {p.name!r}: a test names its yardstick, a pair with "
                "role yardstick"
            )
    return Multiples(tuple(float(f) for f in factors), tuple(best), str(section["chosen"]), pairs)


def _pair(section, i: int, grid: dict, where: str) -> Pair:
    here = f"{where}: multiples.compare[{i}]"
    keys = {"name", "a", "b", "role", "yardstick"}
    if (
        not isinstance(section, dict)
        or not {"name", "a", "b"} <= set(section)
        or (set(section) - keys)
    ):
        raise ConfigError(f"{here} is a mapping of name, a, b, role and yardstick")
    if section.get("role", "check") not in ROLES:
        raise ConfigError(f"{here}.role is one of {', '.join(ROLES)}")
    sides = []
    for side in ("a", "b"):
        given = section[side]
        if not isinstance(given, dict) or not given:
            raise ConfigError(f"{here}.{side} must be a mapping of grid fields to values")
        arm = {}
        for key, values in grid.items():
            if key in ("optim.lr", "train.seed"):
                continue
            arm[key] = values[0]
        for key, value in given.items():
            field = ALIASES.get(key, key)
            if field in ("optim.lr", "train.seed") or field not in grid or value not in grid[field]:
                raise ConfigError(f"{here}.{side}: {key}={value!r} is not a value of the grid")
            arm[field] = value
        sides.append(tuple(arm.items()))
    if sides[0] == sides[1]:
        raise ConfigError(f"{here}: a and b are the same arm")
    return Pair(
        str(section["name"]),
        sides[0],
        sides[1],
        section.get("role", "check"),
        section.get("yardstick"),
    )


def excluded(study: Study, combination: dict) -> bool:
    """Whether a grid combination ({field: value}) is one the study file's `exclude:` drops."""
    return any(
        all(k in combination and combination[k] == v for k, v in e.items())
        for e in study.exclude or []
    )


@dataclass(frozen=True)
class Adaptive:
    """The adaptive edge stage (lab/adaptive.py): rounds of `seeds_per_round` new seeds at `lrs`
    LRs `step` apart around each arm's current LR50 estimate, until each LR50 claim is decided or
    `max_runs` runs per claim are spent; `alpha` is spent equally over the looks (a look after the
    earlier stages and after each round): a claim's p is its raw p x looks."""

    seeds_per_round: int = field(metadata={"range": ">= 1"})
    max_runs: int = field(metadata={"range": ">= 2"})
    first_seed: int = field(metadata={"range": ">= 0"})
    lrs: int = ranged(3, ">= 1")
    step: float = ranged(10**0.25, "> 1")  # x1.78: the grid the rounds' LRs are snapped to
    alpha: float = ranged(0.05, "(0, 1)")
    # an arm with failures but no all-failed LR (or no all-trained one) is centred on its highest
    # (lowest) LR, so its round tries one step beyond, where the edge identification asks for lies;
    # False: on Firth's penalised LR50 (the studies run before this option)
    seek_edge: bool = False

    @property
    def rounds(self) -> int:
        """The most rounds one claim can take within max_runs (2 arms x lrs x seeds a round)."""
        return self.max_runs // (2 * self.lrs * self.seeds_per_round)

    @property
    def looks(self) -> int:
        return self.rounds + 1

    def seeds(self, r: int) -> tuple:
        """Round r's seeds (0-based), the same for every arm (runs paired by seed)."""
        start = self.first_seed + r * self.seeds_per_round
        return tuple(range(start, start + self.seeds_per_round))


ADAPTIVE_KEYS = {"seeds_per_round", "max_runs", "first_seed", "lrs", "step", "alpha", "seek_edge"}


def parse_adaptive(section, seeds: set, where: str) -> Adaptive:
    """The protocol's `adaptive:` section; ConfigError on anything else."""
    allowed = ", ".join(sorted(ADAPTIVE_KEYS))
    if not isinstance(section, dict) or set(section) - ADAPTIVE_KEYS:
        raise ConfigError(f"{where}: protocol.adaptive is a mapping of {allowed}")
    missing = {"seeds_per_round", "max_runs", "first_seed"} - set(section)
    if missing:
        raise ConfigError(f"{where}: protocol.adaptive needs {', '.join(sorted(missing))}")
    ints = ("seeds_per_round", "max_runs", "first_seed", "lrs")
    check_ranges(Adaptive, section, f"{where}: protocol.adaptive.")
    if not isinstance(section.get("seek_edge", False), bool):
        raise ConfigError(f"{where}: protocol.adaptive.seek_edge is true or false")
    a = Adaptive(**{k: (v if k in (*ints, "seek_edge") else float(v)) for k, v in section.items()})
    if a.seeds_per_round < 1 or a.lrs < 1 or a.lrs % 2 == 0 or a.step <= 1 or a.rounds < 1:
        raise ConfigError(
            f"{where}: protocol.adaptive needs seeds_per_round >= 1, an odd lrs >= 1, step > 1 "
            f"and max_runs >= 2 x lrs x seeds_per_round (one round), got {section}"
        )
    if a.alpha != 0.05:
        raise ConfigError(f"{where}: protocol.adaptive.alpha must be the claims' level, 0.05")
    if seeds and a.first_seed <= max(seeds):
        raise ConfigError(
            f"{where}: protocol.adaptive.first_seed must be above every other protocol seed "
            f"(max {max(seeds)}): a round's seeds are its own"
        )
    return a


@dataclass(frozen=True)
class Protocol:
    selection_seeds: tuple[int, ...] = field(metadata={"range": ">= 0"})
    test_seeds: tuple[int, ...] = field(metadata={"range": ">= 0"})
    failure_seeds: tuple[int, ...] = field(metadata={"range": ">= 0"})
    factor: float = ranged(math.sqrt(10), "> 1")  # the bracket's step (x the LR)
    min_lr: float = ranged(1e-5, "> 0")
    max_lr: float = ranged(10.0, "> 0")
    steps: int = ranged(3, ">= 0")  # at most this many LRs beyond each end of the grid
    # the largest spacing left next to the best LR and the failure edge (0: no refinement)
    refine: float = ranged(2.0, ">= 0")
    # the seeds that compare a common_loss claim's arms at their common safe LR
    common_seeds: tuple[int, ...] = field(default=(), metadata={"range": ">= 0"})
    adaptive: Adaptive | None = None  # the adaptive edge stage; None: the study has none
    critical: Critical | None = None  # per-seed critical LRs by bisection; None: none
    # the common LR: "bound" (P(fail)'s upper 95% bound < 5%) or "fitted" (both point estimates
    # < 5% and each arm's loss within common_within nats of its best; lab/protocol.py common_lr)
    # (these three were added after designs were first recorded: lab/design.py leaves each out of
    # a design while it holds its default)
    common_rule: str = field(default="bound", metadata={"added": "issue 76"})
    common_within: float = ranged(0.1, "> 0", added="issue 76")
    # a loss claim's failed runs: "dropped" from the pairs, or "worst" (kept as the worst outcome,
    # decided by a rank test where any failed)
    failed_runs: str = field(default="dropped", metadata={"added": "issue 76"})


@dataclass(frozen=True)
class Critical:
    """protocol.critical: the seeds whose critical LR each arm bisects (lab/critical.py), to which
    resolution (hi / lo), and the equivalence margin of the paired comparison (a ratio)."""

    seeds: tuple[int, ...] = field(metadata={"range": ">= 0"})
    resolution: float = ranged(1.19, "> 1")
    margin: float = ranged(1.1, "> 1")


CRITICAL_KEYS = {"seeds", "resolution", "margin"}


def parse_critical(section, where: str) -> Critical:
    if not isinstance(section, dict) or set(section) - CRITICAL_KEYS or "seeds" not in section:
        raise ConfigError(
            f"{where}: protocol.critical is a mapping of seeds (a list) and optionally "
            "resolution and margin (ratios > 1)"
        )
    seeds = section["seeds"]
    if not isinstance(seeds, list) or len(seeds) < 2:
        raise ConfigError(f"{where}: protocol.critical.seeds must list 2 or more integer seeds")
    in_range(Critical, "seeds", seeds, f"{where}: protocol.critical.")
    _once(seeds, f"{where}: protocol.critical.seeds")
    check_ranges(Critical, section, f"{where}: protocol.critical.")
    return Critical(
        tuple(seeds), **{k: float(section[k]) for k in ("resolution", "margin") if k in section}
    )


PROTOCOL_KEYS = {
    "common_lr",
    "failed_runs",
    "selection_seeds",
    "test_seeds",
    "failure_seeds",
    "common_seeds",
    "bracket",
    "refine",
    "adaptive",
    "critical",
}
BRACKET_KEYS = {"factor", "min_lr", "max_lr", "steps"}


def parse_protocol(section, where: str) -> Protocol:
    """The study file's `protocol:` section; ConfigError on anything else."""
    if (
        not isinstance(section, dict)
        or set(section) - PROTOCOL_KEYS
        or not {"selection_seeds", "test_seeds"} <= set(section)
    ):
        raise ConfigError(
            f"{where}: protocol is a mapping with selection_seeds and test_seeds (lists of seeds) "
            "and "
            "optionally failure_seeds, common_seeds, bracket "
            f"{{{', '.join(sorted(BRACKET_KEYS))}}}, "
            f"refine, adaptive {{{', '.join(sorted(ADAPTIVE_KEYS))}}}"
        )
    seeds = {}
    for key in ("selection_seeds", "test_seeds", "failure_seeds", "common_seeds"):
        value = section.get(key, [] if key == "common_seeds" else section["test_seeds"])
        if key == "common_seeds" and value == []:
            seeds[key] = ()
            continue
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{where}: protocol.{key} must be a non-empty list of integer seeds")
        in_range(Protocol, key, value, f"{where}: protocol.")
        _once(value, f"{where}: protocol.{key}")
        seeds[key] = tuple(value)
    if set(seeds["selection_seeds"]) & (
        set(seeds["test_seeds"]) | set(seeds["failure_seeds"]) | set(seeds["common_seeds"])
    ):
        raise ConfigError(
            f"{where}: protocol.selection_seeds must not appear among the test, failure or common "
            f"seeds (an LR is chosen on some seeds and tested on others)"
        )
    bracket = section.get("bracket") or {}
    if not isinstance(bracket, dict) or set(bracket) - BRACKET_KEYS:
        raise ConfigError(f"{where}: protocol.bracket takes {', '.join(sorted(BRACKET_KEYS))}")
    check_ranges(Protocol, bracket, f"{where}: protocol.bracket.")
    if "refine" in section:
        in_range(Protocol, "refine", section["refine"], f"{where}: protocol.")
    adaptive = section.get("adaptive")
    choices = {}
    common = section.get("common_lr", {"rule": "bound"})
    if (
        not isinstance(common, dict)
        or set(common) - {"rule", "within"}
        or common.get("rule", "bound") not in ("bound", "fitted")
    ):
        raise ConfigError(
            f"{where}: protocol.common_lr is a mapping of rule (bound | fitted) and within "
            "(nats > 0)"
        )
    if "within" in common:
        in_range(Protocol, "common_within", common["within"], f"{where}: protocol.common_lr.")
        choices["common_within"] = float(common["within"])
    choices["common_rule"] = common.get("rule", "bound")
    if section.get("failed_runs", "dropped") not in ("dropped", "worst"):
        raise ConfigError(f"{where}: protocol.failed_runs is one of dropped, worst")
    choices["failed_runs"] = section.get("failed_runs", "dropped")
    if choices["common_rule"] == "fitted" or choices["failed_runs"] == "worst":
        if len(seeds["selection_seeds"]) < 5:
            raise ConfigError(
                f"{where}: protocol.selection_seeds lists {len(seeds['selection_seeds'])} seeds; "
                "a study that chooses its LRs this way chooses them on 5 or more"
            )
    out = Protocol(
        **choices,
        **seeds,
        **{k: type(getattr(Protocol, k))(v) for k, v in bracket.items()},
        refine=float(section.get("refine", Protocol.refine)),
        adaptive=None
        if adaptive is None
        else parse_adaptive(adaptive, {s for v in seeds.values() for s in v}, where),
        critical=None if "critical" not in section else parse_critical(section["critical"], where),
    )
    if (
        out.factor <= 1
        or not 0 < out.min_lr < out.max_lr
        or out.steps < 0
        or (out.refine and out.refine <= 1)
    ):
        raise ConfigError(
            f"{where}: protocol needs bracket.factor > 1, 0 < min_lr < max_lr, steps >= 0 and "
            f"refine > 1 (or 0 for none)"
        )
    return out


@dataclass(frozen=True)
class Rule:
    """When a study run fails, fixed in the study file before the runs (the same code judges live
    runs, reruns and archives): a non-finite loss always; and each criterion that is set:
      learn_margin   no eval got this many nats below the unigram entropy within the run's budget
                     (whatever its last slope: a run still falling at the end of its budget failed
                     at that budget)
      blowup_margin  an eval rose this many nats above the best eval before it
      above_l0       an eval rose above L0, the loss before the first step
      arm_gap        its final loss is this many nats above the best final loss of any run of
                     its arm
    and how a failed run's kind is read from its curve (lab/read.py failure_kind): slow_slope,
    nats per 10% of the budget (the least-squares slope of the evals in the run's last half) below
    which a run is still falling."""

    name: str = "main"
    learn_margin: float | None = ranged(0.25, ">= 0")  # null: the criterion is off
    blowup_margin: float | None = ranged(0.5, ">= 0")
    above_l0: bool = True
    arm_gap: float | None = ranged(None, ">= 0")
    slow_slope: float = ranged(0.01, ">= 0")
    # learn_margin judged speed-free: only a collapse that persists to the end fails (the final
    # eval within learn_margin of the unigram entropy and the last half not falling faster than
    # slow_slope); a run still falling there is slow, not unstable (issue 60's primary rule)
    speed_free: bool = False
    # with speed_free: a final eval above the unigram entropy fails whatever its slope (a run
    # falling toward the unigram level from above relearns it after a collapse; it is not slow)
    above_unigram: bool = False
    labels: bool = (
        False  # judge by train.py's own labels instead (runs compared without a study file)
    )

    def describe(self) -> str:
        if self.labels:
            return "train.py's own label collapsed, unstable or diverged (ok and plateau trained)"
        parts = ["a non-finite loss"]
        if self.learn_margin is not None and self.speed_free:
            parts.append(
                f"a collapse that persists (the final eval within {self.learn_margin:g} nats of "
                f"the unigram entropy, its last half not falling {self.slow_slope:g} nats per 10% "
                "of the budget: a run still falling is slow, not failed)"
            )
            if self.above_unigram:
                parts.append("a final eval above the unigram entropy, whatever its slope")
        elif self.learn_margin is not None:
            parts.append(
                f"no eval {self.learn_margin:g} nats below the unigram entropy within the budget"
            )
        if self.blowup_margin is not None:
            parts.append(f"an eval {self.blowup_margin:g} nats above its best so far")
        if self.above_l0:
            parts.append("an eval above L0")
        if self.arm_gap is not None:
            parts.append(f"a final loss {self.arm_gap:g} nats above its arm's best")
        return ", ".join(parts[:-1]) + " or " + parts[-1]


DEFAULT_ALTERNATIVES = (
    Rule("the arm's best + 1 nat", None, None, False, 1.0),
    Rule("lenient: 0.1 below unigram, 1 nat blow-up", 0.1, 1.0, True, None),
)
RULE_KEYS = {
    "name",
    "learn_margin",
    "blowup_margin",
    "above_l0",
    "arm_gap",
    "slow_slope",
    "speed_free",
    "above_unigram",
}


def parse_rule(section, where: str, name: str) -> Rule:
    if not isinstance(section, dict) or set(section) - RULE_KEYS:
        raise ConfigError(f"{where}: a failure rule is a mapping of {', '.join(sorted(RULE_KEYS))}")
    out = Rule(**{"name": name, **{k: section[k] for k in section}})
    check_ranges(Rule, section, f"{where}: ")
    for key in ("above_l0", "speed_free", "above_unigram"):
        if not isinstance(getattr(out, key), bool):
            raise ConfigError(f"{where}: {key} is true or false")
    if out.above_unigram and not out.speed_free:
        raise ConfigError(
            f"{where}: above_unigram amends speed_free: true (without it, learn_margin already "
            "fails a run that never got below the unigram entropy)"
        )
    return out


def parse_failure(section, where: str) -> tuple[Rule, tuple[Rule, ...]]:
    """The study file's `failure:` section: the main rule's criteria and its `alternatives` (a list
    of rules, each with a name), reported beside it; without the section, Rule() and
    DEFAULT_ALTERNATIVES."""
    if section is None:
        return Rule(), DEFAULT_ALTERNATIVES
    if not isinstance(section, dict):
        raise ConfigError(
            f"{where}: failure is a mapping: the main rule's criteria and alternatives"
        )
    alternatives = section.get("alternatives", [])
    if not isinstance(alternatives, list) or any(
        not isinstance(a, dict) or "name" not in a for a in alternatives
    ):
        raise ConfigError(f"{where}: failure.alternatives is a list of rules, each with a name")
    main = parse_rule({k: v for k, v in section.items() if k != "alternatives"}, where, "main")
    return main, tuple(
        parse_rule({k: v for k, v in a.items() if k != "name"}, where, str(a["name"]))
        for a in alternatives
    )


CLAIM_METRICS = {
    "best_loss": (
        "final val loss, each arm at its own best LR (chosen on the selection seeds), paired on "
        "the test seeds where both trained"
    ),
    "common_loss": (
        "final val loss of both arms at one common safe LR (both arms' P(fail) there below "
        "5% at its upper one-sided 95% bound), paired on the common seeds"
    ),
    "lr50": "LR50, the LR at which half the runs fail (both arms' failure curves, one slope)",
    "lr_sensitivity": "LR sensitivity (Wortsman et al. 2023): mean over the study's LR grid of "
    "min(L, L0) - L*, paired by seed",
}
CLAIM_EXPECTS = ("higher", "lower", "same")


def _claim(path: Path, i: int, claim, grid: dict) -> dict:
    """A claim of the literature, to be checked by the report: arm(s) a vs arm(s) b on a metric,
    expecting a higher, lower or the same value; a and b name grid values, fields left out range
    over the grid."""
    where = f"{path}: claims[{i}]"
    if not isinstance(claim, dict) or set(claim) != {"paper", "says", "a", "b", "metric", "expect"}:
        raise ConfigError(f"{where} needs exactly: paper, says, a, b, metric, expect")
    if claim["metric"] not in CLAIM_METRICS or claim["expect"] not in CLAIM_EXPECTS:
        raise ConfigError(
            f"{where}: metric is one of {', '.join(CLAIM_METRICS)}; expect one of "
            f"{', '.join(CLAIM_EXPECTS)}"
        )
    sides = {}
    for side in ("a", "b"):
        if not isinstance(claim[side], dict) or not claim[side]:
            raise ConfigError(f"{where}.{side} must be a mapping of grid fields to values")
        sides[side] = {}
        for key, value in claim[side].items():
            field = ALIASES.get(key, key)
            if field in ("optim.lr", "train.seed") or field not in grid or value not in grid[field]:
                raise ConfigError(
                    f"{where}.{side}: {key}={value!r} is not a value of the grid (arms are grid "
                    f"values other than lr and seed)"
                )
            sides[side][field] = value
    if sides["a"] == sides["b"]:
        raise ConfigError(f"{where}: a and b are the same arm")
    return {**claim, **sides}


def expected_time(study: Study, runs: list[dict]) -> str | None:
    """The study file's `expected: {device, mfu, gpus}` turned into an estimate from the model's
    FLOPs: training FLOPs of every run (training/flops.py, 6N + 12LdT per token x batch x seq_len x
    steps; evals not counted) over `gpus` devices at `mfu` of the device's dense peak. None without
    an `expected` section."""
    import train

    exp = study.expected
    if not exp:
        return None
    total, peak = 0.0, None
    device, dtype = str(exp["device"]), str(exp.get("dtype", "bfloat16"))
    for r in runs:
        cfg = load_config(study.config, r["overrides"])
        about, t = train.describe(cfg, device, dtype), cfg.train
        total += about["flops_per_token"] * t.batch_size * t.seq_len * t.steps
        peak = about["peak_flops"]
    if not peak:
        raise ConfigError(
            f"expected.device {exp['device']!r} has no known peak (training/flops.py PEAK_TFLOPS)"
        )
    gpus, mfu = int(exp.get("gpus", 8)), float(exp.get("mfu", 0.4))
    hours = total / (peak * mfu * gpus) / 3600
    return (
        f"expected: {total:.3g} training FLOPs over {len(runs)} runs = {hours:.1f} h on {gpus} x "
        f"{exp['device']} "
        f"at {mfu:.0%} MFU ({total / len(runs) / (peak * mfu) / 3600:.2f} GPU-h per run)"
    )


def quick_study(study: Study) -> Study:
    """The study's `quick` version (its grid, overrides and config replace the study's), named
    <name>-quick: a seconds-long smoke run of the same axes. Claims are kept (their values must be
    in the quick grid)."""
    quick = study.quick
    if quick is None:
        raise ConfigError(f"study {study.name!r} has no quick section")
    out = dataclasses.replace(study, name=f"{study.name}-quick", protocol=None)
    if "config" in quick:
        out.config = train_config(Path(study.dir) / "study.yaml", quick["config"])
    if "overrides" in quick:
        out.overrides = OmegaConf.to_container(
            OmegaConf.merge(study.overrides or {}, quick["overrides"])
        )
        out.written = out.written | {"overrides"}
    if "grid" in quick:
        out.grid = {ALIASES.get(k, k): v for k, v in quick["grid"].items()}
    out.claims = [
        c
        for c in study.claims
        if all(v in out.grid.get(k, []) for side in ("a", "b") for k, v in c[side].items())
    ]
    return out


def flatten(d: dict, prefix: str = "") -> list[str]:
    """{'train': {'steps': 5}} -> ['train.steps=5']."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += flatten(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={'null' if v is None else v}")
    return out


def _slug(key: str, value) -> str:
    short = {"model.norm": "", "model.placement": "", "optim.lr": "lr", "train.seed": "s"}
    return f"{short.get(key, key.rsplit('.', 1)[-1])}{value}"


@functools.lru_cache(maxsize=65536)
def _validate(config: str, overrides: tuple) -> None:
    """A run's config loads (once per config and overrides: the protocol's stages ask again and
    again)."""
    load_config(config, list(overrides))


def expand(study: Study, extra: list[str] = ()) -> list[dict]:
    """One {'name', 'overrides'} per grid combination not excluded, in grid order; every config
    validated up front."""
    base = flatten(study.overrides or {}) + list(extra)
    runs = []
    for combination in _combinations(study):
        name = "-".join(_slug(k, v) for k, v in combination.items())
        overrides = base + [f"{k}={v}" for k, v in combination.items()]
        _validate(str(study.config), tuple(overrides))  # raises ConfigError on a bad value
        runs.append({"name": name, "overrides": overrides})
    return runs


def _combinations(study: Study):
    """The grid's combinations not excluded, in grid order; with `multiples`, each arm's at each
    factor x its best LR (the LR after the arm's fields, before the seed)."""
    keys = list(study.grid)
    multiples = study.multiples
    if multiples is None:
        for values in itertools.product(*study.grid.values()):
            combination = dict(zip(keys, values, strict=True))
            if not excluded(study, combination):
                yield combination
        return
    seeds = study.grid["train.seed"]
    out = []
    for values in itertools.product(*study.grid.values()):
        combination = dict(zip(keys, values, strict=True))
        if excluded(study, combination):
            continue
        seed = combination.pop("train.seed")
        best = multiples.lr(combination)
        for f in multiples.factors:
            out.append({**combination, "optim.lr": multiple_lr(best, f), "train.seed": seed})
    # seed by seed: a study stopped part way has whole pairs
    yield from sorted(out, key=lambda c: seeds.index(c["train.seed"]))


# kept as the file writes them (and hashed into the design only where the file has them)
GIVEN_AS_WRITTEN = (
    *("overrides", "failure", "margin_reason", "slurm", "expected", "equivalence_margin"),
    *("sensitivity_margin", "ratio_margin", "threads_per_worker", "workers"),
)
# in every design (a design hashes the parsed study file less its history notes and its folder)
IN_EVERY_DESIGN = (
    *("name", "about", "config", "grid", "exclude", "protocol", "rule", "alternatives"),
    *("claims", "withdrawn", "quick"),
)


@dataclass
class Study:
    """A study file, parsed and checked by load_study: the grid's keys resolved to dotted config
    fields, each section its type, each number in the range beside its field."""

    name: str
    config: str  # the training config its runs start from (a path: train_config)
    dir: str  # the study file's folder
    grid: dict  # {dotted field: [values]}
    about: str = ""
    overrides: dict = field(default_factory=dict)  # nested, as the file writes them
    exclude: list = field(default_factory=list)  # [{field: value}]: combinations not run
    protocol: Protocol | None = None
    rule: Rule = field(default_factory=Rule)
    alternatives: tuple = DEFAULT_ALTERNATIVES
    claims: list = field(default_factory=list)  # [{paper, says, a, b, metric, expect}]
    withdrawn: list = field(default_factory=list)  # [{paper, says, why}]
    history: list = field(default_factory=list)  # notes on changes made after results
    quick: dict | None = None  # what --quick replaces: config, overrides, grid
    multiples: Multiples | None = None
    failure: dict | None = None  # the failure section as written (rule, alternatives parse it)
    slurm: dict | None = None
    expected: dict | None = None  # {device, mfu, gpus}: expected_time
    margin_reason: str | None = None
    equivalence_margin: float | None = ranged(None, "> 0")  # nats
    sensitivity_margin: float | None = ranged(None, "> 0")  # nats
    ratio_margin: float | None = ranged(None, "> 1")  # a ratio within [1/m, m]
    threads_per_worker: int | None = ranged(None, ">= 1")
    workers: int | None = ranged(None, ">= 1")
    design: str | None = None  # the design its runs are made under (the sweep sets it)
    written: frozenset = frozenset()  # the keys the file has

    def design_body(self) -> dict:
        """What a design hashes of the study file: every parsed section, and the optional keys
        where the file has them (as written), less its history notes and its folder."""
        optional = [k for k in (*GIVEN_AS_WRITTEN, "multiples") if k in self.written]
        return {k: getattr(self, k) for k in (*IN_EVERY_DESIGN, *optional)}

    def as_dict(self) -> dict:
        """The study as sweep.json records it: the design's body, its folder, notes and design."""
        notes = {"history": self.history} if "history" in self.written else {}
        design = {"design": self.design} if self.design else {}
        return {**self.design_body(), "dir": self.dir, **notes, **design}

    @property
    def threads(self) -> int:
        """Threads per run (threads_per_worker, default 1)."""
        return int(self.threads_per_worker or 1)


@dataclass
class StudyFile:
    """What a report reads of a Study (read_study_file), its defaults resolved: what it asks, its
    margin and why, its claims, its protocol. Runs compared without a study file get the
    defaults."""

    name: str
    about: str = ""
    margin: float = DEFAULT_MARGIN
    margin_reason: str | None = None
    claims: list = field(default_factory=list)
    protocol: Protocol | None = None
    withdrawn: list = field(default_factory=list)  # [{paper, says, why}]
    rule: Rule = field(default_factory=Rule)
    alternatives: tuple = DEFAULT_ALTERNATIVES
    sensitivity_margin: float = 0.1  # nats: LR sensitivity's equivalence margin
    ratio_margin: float = 2.0  # an LR50 ratio within [1/m, m] is "the same"
    grid_lrs: tuple = ()  # the study file's LR grid: where LR sensitivity is measured
    # notes on changes made after results (lab/history.py)
    history: list = field(default_factory=list)
    given: bool = True  # False: runs compared without a study file (train.py's labels judge them)
    path: Path | None = None  # the study file (its arms' configs state the budget)
    multiples: Multiples | None = None  # loss at multiples of each arm's best LR (lab/multiples.py)


def study_file(paths: list[Path]) -> StudyFile:
    """The first study.yaml among `paths` (a study directory keeps a copy of its file), else the
    defaults."""
    for p in paths:
        if (p / "study.yaml").is_file():
            return read_study_file(p / "study.yaml")
    return StudyFile(
        ", ".join(p.name for p in paths),
        rule=Rule(name="train.py's labels", labels=True),
        alternatives=(),
        given=False,
    )


def read_study_file(path: Path) -> StudyFile:
    study = load_study(path)
    return StudyFile(
        study.name,
        study.about,
        float(study.equivalence_margin or DEFAULT_MARGIN),
        study.margin_reason,
        study.claims,
        study.protocol,
        study.withdrawn,
        study.rule,
        study.alternatives,
        float(study.sensitivity_margin or 0.1),
        float(study.ratio_margin or 2.0),
        tuple(study.grid.get("optim.lr", ())),
        list(study.history),
        path=path,
        multiples=study.multiples,
    )


def arm_configs(study: Study) -> list:
    """One training config per arm (every grid field but the LR and the seed, exclusions dropped):
    what its model and budget are."""
    axes = {k: v for k, v in study.grid.items() if k not in ("optim.lr", "train.seed")}
    base = flatten(study.overrides or {})
    out = []
    for values in itertools.product(*axes.values()):
        arm = dict(zip(axes, values, strict=True))
        if not excluded(study, arm):
            out.append(load_config(study.config, base + [f"{k}={v}" for k, v in arm.items()]))
    return out
