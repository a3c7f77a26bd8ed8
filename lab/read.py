"""Reading run directories into runs and arms: a run is what train.py wrote (config.yaml,
summary.json, metrics.jsonl); arms group runs by every config field that differs, except the
learning rate and the seed. Each finished run is judged by the study's failure rule
(studyfile.Rule): one function, `failure`, for live runs, reruns and archived runs alike; train.py's
own label (`status`) stays for a single run's message."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from lab.studyfile import Rule
from training import monitor
from training.config import Config, flat, to_dict
from training.rundir import RunDir, read_json, series, spike_scores

# not arms: the x axis and the seeds, where and how a run was kept, and how its spikes were measured
# (the same experiment whatever the detector's parameters: studies from before the detector changed
# still pair)
IGNORED = {
    "optim.lr",
    "train.seed",
    "log.name",
    "log.out_dir",
    "train.threads",
    "data.root",
    "log.wandb",
    "log.spike_window",
    "log.spike_k",
}


# failed: crashed without a summary (sweep.json has the error)
OUTCOMES = (*monitor.OUTCOMES, "failed")
# what a failed run's curve says it was (failure_kind); instability is the first three, a slow run
# is censored
KINDS = ("collapsed", "blew up", "non-finite", "slow", "stalled", "no curve")
INSTABILITY = ("collapsed", "blew up", "non-finite")


@dataclass
class Run:
    name: str
    path: Path
    config: dict  # flattened: {"model.norm": "rmsnorm", ...}
    summary: dict
    records: list[dict]
    # the study rule's reason it failed; None: it trained
    why: str | None = field(default=None, compare=False)
    # the rule that judged it (None: not yet)
    judged_by: str | None = field(default=None, compare=False)
    # a failed run's kind (KINDS); None: it trained
    kind: str | None = field(default=None, compare=False)

    @property
    def lr(self) -> float:
        return float(self.config["optim.lr"])

    @property
    def status(self) -> str:
        return self.summary.get("status", "failed")

    @property
    def final(self) -> float | None:
        """Final val loss of a run that finished without diverging."""
        v = self.summary.get("final_val_loss")
        return (
            v
            if self.status in ("ok", "plateau", "collapsed", "unstable") and v is not None
            else None
        )

    @property
    def init_loss(self) -> float | None:
        """L0: the val loss logged at step 0, before the first update (runs from before it was
        logged: the first train loss, a different kind of number; `init_kind` says which)."""
        step0 = [
            r["val/loss"]
            for r in self.records
            if r.get("step") == 0 and r.get("val/loss") is not None
        ]
        if step0:
            return step0[0]
        first = series(self.records[:1], "train/loss")
        return first[0] if first else None

    @property
    def init_kind(self) -> str:
        return (
            "val" if any(r.get("step") == 0 and "val/loss" in r for r in self.records) else "train"
        )

    @property
    def seed(self):
        return self.config.get("train.seed")

    @property
    def finished(self) -> bool:
        return self.status in monitor.FINISHED

    @property
    def trained(self) -> bool:
        """Finished and not failed under the study's rule: its final loss is a result to compare."""
        return self.finished and not self.failed

    @property
    def failed(self) -> bool:
        """Failed under the study's rule (or, before a rule judged it, train.py's failed labels): an
        outcome for the failure curve, never a loss to average."""
        if self.judged_by is None:
            return self.status in monitor.FAILED or self.status == "plateau"
        return self.why is not None

    @property
    def evals(self) -> list[float]:
        """The val losses after step 0, in order (the run's curve)."""
        return [
            r["val/loss"]
            for r in self.records
            if r.get("val/loss") is not None and r.get("step", 0) > 0
        ]

    @property
    def loss(self) -> float | None:
        """What loss comparisons use: the final val loss of a run that trained, else None."""
        return self.final if self.trained else None


def same(x, y) -> bool:
    """Config values equal as the YAML meant them (0.1 == 0.1, 12 == 12.0, but False != 0)."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y))
    return float(x) == float(y) if numbers else x == y


def failure(run: Run, rule: Rule, arm_best: float | None = None) -> str | None:
    """Why `run` failed under `rule` (one phrase), or None if it trained. Where the run has no curve
    (an archive that kept only its final and best losses) the any-eval criteria read the final eval,
    and its best."""
    if rule.labels:  # no study file: train.py's own verdict on the run
        return None if run.status in ("ok", "plateau") else f"train.py: {run.status}"
    s = run.summary
    final, best = s.get("final_val_loss"), s.get("best_val_loss")
    if run.status == "diverged" or final is None or not math.isfinite(final):
        return "non-finite loss" if run.status == "diverged" else "no final loss"
    evals = run.evals or [final]
    best = min([*evals, *([best] if best is not None and math.isfinite(best) else [])])
    unigram = s.get("unigram_entropy")
    if rule.learn_margin is not None and unigram is not None and rule.speed_free:
        _, b = last_half(run)  # still falling (b < -slow_slope): slow, not failed
        if final > unigram - rule.learn_margin and (b is None or b >= -rule.slow_slope):
            return f"collapsed: final {final:.2f} > unigram {unigram:.2f} - {rule.learn_margin:g}"
        if rule.above_unigram and final > unigram:  # relearning the unigram level: not slow
            return f"collapsed: final {final:.2f} > unigram {unigram:.2f}, falling"
    elif rule.learn_margin is not None and unigram is not None:
        if best > unigram - rule.learn_margin:
            return f"did not learn: best {best:.2f} > unigram {unigram:.2f} - {rule.learn_margin:g}"
    if rule.blowup_margin is not None:
        low = math.inf
        for v in evals:
            if v > low + rule.blowup_margin:
                return f"blew up: {v:.2f} after {low:.2f}"
            low = min(low, v)
        if final > best + rule.blowup_margin:
            return f"blew up: final {final:.2f}, best {best:.2f}"
    l0 = run.init_loss if run.init_kind == "val" else None
    if rule.above_l0 and l0 is not None and max(evals) > l0:
        return f"rose above L0: {max(evals):.2f} > {l0:.2f}"
    if rule.arm_gap is not None and arm_best is not None and final > arm_best + rule.arm_gap:
        return f"final {final:.2f} > its arm's best {arm_best:.2f} + {rule.arm_gap:g}"
    return None


def slope(points: list[tuple[int, float]], steps: int) -> float | None:
    """Least-squares slope of (step, loss) points in nats per 10% of a budget of `steps`; None below
    2 steps."""
    if len({s for s, _ in points}) < 2:
        return None
    ms = sum(s for s, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    b = sum((s - ms) * (v - mv) for s, v in points) / sum((s - ms) ** 2 for s, _ in points)
    return b * steps / 10


def last_half(run: Run, points: list | None = None) -> tuple[list, float | None]:
    """(the evals of the last half of the run's budget, their slope in nats per 10% of it): < 0
    while the run is still falling when its budget ends."""
    if points is None:
        points = [
            (r["step"], r["val/loss"])
            for r in run.records
            if r.get("val/loss") is not None and r.get("step", 0) > 0
        ]
    steps = int(run.config.get("train.steps") or (points[-1][0] if points else 0))
    half = [(st, v) for st, v in points if st >= steps / 2]
    return half, slope(half, steps)


def failure_kind(run: Run, rule: Rule) -> str:
    """What a failed run's recorded eval curve says it was (docs/METHODS.md, "Failure kinds"):
    non-finite; blew up (an eval above its best so far by the blow-up margin, or above L0); slow
    (still falling at the end, the slope of the last half's evals below -slow_slope nats per 10% of
    the budget, and already below the unigram entropy: it learns what a unigram model cannot);
    collapsed (every eval of the last half at or above the unigram entropy minus the learn margin:
    flat there, or falling back to it from above); stalled (flat below that level: it failed a rule
    relative to other runs); no curve (an archive without one)."""
    s = run.summary
    final = s.get("final_val_loss")
    if run.status == "diverged" or final is None or not math.isfinite(final):
        return "non-finite"
    points = [
        (r["step"], r["val/loss"])
        for r in run.records
        if r.get("val/loss") is not None and r.get("step", 0) > 0
    ]
    blowup = rule.blowup_margin if rule.blowup_margin is not None else Rule.blowup_margin
    low = math.inf
    for _, v in points:
        if v > low + blowup:
            return "blew up"
        low = min(low, v)
    l0 = run.init_loss if run.init_kind == "val" else None
    if l0 is not None and points and max(v for _, v in points) > l0:
        return "blew up"
    half, b = last_half(run, points)
    if b is None:
        return "no curve"
    unigram = s.get("unigram_entropy")
    if b < -rule.slow_slope and (unigram is None or half[-1][1] < unigram):
        return "slow"
    learn = rule.learn_margin if rule.learn_margin is not None else Rule.learn_margin
    if unigram is not None and all(v > unigram - learn for _, v in half):
        return "collapsed"
    return "stalled"


def arm_bests(runs: list[Run]) -> dict[int, float | None]:
    """{id(run): the best finite final val loss of any run of its arm}."""
    out = {}
    for rs in group_arms(runs)[1].values():
        finals = [r.summary.get("final_val_loss") for r in rs if r.finished]
        finite = [v for v in finals if v is not None and math.isfinite(v)]
        for r in rs:
            out[id(r)] = min(finite) if finite else None
    return out


def judge(runs: list[Run], rule: Rule) -> list[Run]:
    """Judge every finished run by `rule` (Run.why, Run.judged_by); unfinished runs are neither
    trained nor failed. Returns the runs."""
    best = arm_bests(runs) if rule.arm_gap is not None else {}
    for r in runs:
        r.judged_by = rule.name
        r.why = failure(r, rule, best.get(id(r))) if r.finished else None
        r.kind = failure_kind(r, rule) if r.why is not None else None
    return runs


def _ended(study_dir: Path) -> set[str] | None:
    """The runs a study folder's index (sweep.json, or a job array's sweep-K-of-N.json) has an
    outcome for; None without an index. A run folder without a summary that no index lists is in
    flight or was interrupted: not an outcome yet (the sweep reruns it)."""
    names, found = set(), False
    for index in study_dir.glob("sweep*.json"):
        try:
            names |= {r["name"] for r in read_json(index).get("runs", [])}
            found = True
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return names if found else None


def _running(d: Path) -> bool:
    """Whether run d is still being written (its lock held, no summary yet): left out, said once."""
    if RunDir(d).summary.is_file() or not RunDir(d).live():
        return False
    print(f"note: {d} is still running: left out until it ends", file=sys.stderr)
    return True


def find_runs(paths: list[Path], rule: Rule | None = None) -> list[Run]:
    """Every run directory (one with config.yaml) given directly, or inside a study's runs/ folder
    (less those in flight or interrupted: _ended), judged by `rule` (the default Rule where no
    study file gives one)."""
    dirs = []
    for p in paths:
        if RunDir(p).config.is_file():
            dirs.append(p)
        else:
            base = p / "runs" if (p / "runs").is_dir() else p
            ended = _ended(p)
            dirs += (
                sorted(
                    d
                    for d in base.iterdir()
                    if RunDir(d).config.is_file()
                    and (ended is None or d.name in ended or RunDir(d).summary.is_file())
                    and not _running(d)
                )
                if base.is_dir()
                else []
            )
    runs = [_read(d) for d in dirs]
    return judge(runs, rule or Rule())


# a run's files, read and judged, by run folder: a sweep decides each stage of its protocol from
# every run so far, and reading thousands of runs again (config, curve, spike scores) cost ~0.04 s
# a run each time. Keyed by each file's inode, size and mtime (every write is a rename: a new inode)
_READ: dict[Path, tuple[tuple, dict, dict, list[dict]]] = {}


def _stamp(*paths: Path) -> tuple:
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _read(d: Path) -> Run:
    """Run folder d as find_runs reads it: its config over today's defaults, its summary with the
    status and spike scores re-derived by today's rules, and its records."""
    run = RunDir(d)
    key = _stamp(run.config, run.summary, run.metrics)
    hit = _READ.get(d.absolute())
    if hit is not None and hit[0] == key:
        _, config, summary, records = hit
        return Run(d.name, d, dict(config), dict(summary), records)
    summary = run.read_summary() or {"status": "failed"}  # crashed before writing its summary
    # a field added after a run was made is missing from its config.yaml; new fields default to
    # the old behaviour, so the run is read as having the default (runs from before and after
    # compare)
    try:
        written = flat(OmegaConf.to_container(OmegaConf.load(run.config)))
        config = {**flat(to_dict(Config())), **written}
    except Exception as e:  # a run directory whose config.yaml is not what train.py wrote
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{run.config} cannot be read: {first}") from None
    records = run.records()
    summary["status"] = judged(config, summary, records)
    summary.update(rescored(config, records))
    _READ[d.absolute()] = (key, config, summary, records)
    return Run(d.name, d, dict(config), dict(summary), records)


def rescored(config: dict, records: list[dict]) -> dict:
    """A run's spike scores from its records by today's detector (normlab/spikes.py), as its
    failure is judged again: a summary written by an older detector is not read; {} without
    records (an archive keeps the scores it has)."""
    if not records:
        return {}
    window, k = int(config.get("log.spike_window", 5)), float(config.get("log.spike_k", 5.0))
    return spike_scores(records, window, k)


def judged(config: dict, summary: dict, records: list[dict]) -> str:
    """A finished run's outcome under the current rules (training/monitor.py classify, as train.py
    judges it), from its own val curve: a report never mixes runs judged by two versions of the
    rules. Runs without a curve or a unigram entropy, and diverged ones, keep the status they ended
    with."""
    status = summary.get("status", "failed")
    evals = [
        (r["step"], r["val/loss"])
        for r in records
        if r.get("val/loss") is not None and r.get("step", 0) > 0
    ]
    if (
        status not in ("ok", "plateau", "collapsed", "unstable")
        or not evals
        or summary.get("unigram_entropy") is None
    ):
        return status
    init = next(
        (r["val/loss"] for r in records if r.get("step") == 0 and r.get("val/loss") is not None),
        None,
    )
    return monitor.classify(
        [v for _, v in evals],
        summary["unigram_entropy"],
        config["log.plateau_margin"],
        init,
        config["log.blowup_margin"],
        [s for s, _ in evals],
        config["log.flat_horizon"],
        summary.get("dead_gradients_at"),
    )


def arm_label(config: dict, keys: list[str]) -> str:
    parts = [
        str(config[k])
        if k in ("model.norm", "model.placement")
        else f"{k.rsplit('.', 1)[-1]}={config[k]}"
        for k in keys
    ]
    return "/".join(parts) or "all"


def group_arms(runs: list[Run]) -> tuple[list[str], dict[str, list[Run]]]:
    """(the config keys that define arms, {arm label: runs}) in a stable order."""
    fields = {k for r in runs for k in r.config} - set(IGNORED)
    keys = sorted(  # each field once over the runs: linear in the runs, not quadratic
        (k for k in fields if len({json.dumps(x.config.get(k)) for x in runs}) > 1),
        key=lambda k: (k not in ("model.norm", "model.placement"), k != "model.norm", k),
    )
    arms: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: [str(r.config.get(k)) for k in keys]):
        arms.setdefault(arm_label(r.config, keys), []).append(r)
    return keys, arms
