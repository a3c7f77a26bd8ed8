"""The study: grid expansion, skip / resume / failure handling of sweep.py, and compare.py's
numbers."""

import copy
import dataclasses
import json
import math
import os
import statistics
import subprocess
from pathlib import Path

import pytest
from conftest import write_run

import lab.sweep as sweep_cli
import train
from lab import arms, protocol, runner, studyfile
from lab import read as study_runs
from lab.compare import compare
from lab.pack import pack, unpack
from lab.report import write_report
from lab.result import wall_span
from lab.sweep import sweep
from training.config import ConfigError, load_config

CONFIGS = train.REPO / "configs" / "train"
STUDIES = train.REPO / "lab" / "studies"


@pytest.mark.slow
def test_default_study_grid_expands_as_specified():
    """The default study (issue 40): d 32 at the width init, three budgets 10x apart, 5 LRs on 3
    selection seeds, 16 common seeds, the adaptive edge stage; the pystdlib replication the same
    design on the other corpus."""
    study = studyfile.load_study(STUDIES / "norm-placement-lr.yaml")
    runs = protocol.first_runs(study)
    combos = set()
    for r in runs:
        cfg = load_config(study.config, r["overrides"])
        combos.add(
            (cfg.model.norm, cfg.model.placement, cfg.train.steps, cfg.optim.lr, cfg.train.seed)
        )
        # the overrides reach every run
        assert cfg.model.dim == 32 and cfg.model.init_scale == "width"
        assert cfg.model.dim // cfg.model.n_heads == 16  # the head dim of the d 64 model, kept
    lrs = {c[3] for c in combos}
    assert len(runs) == len(combos) == 180 and len({r["name"] for r in runs}) == 180
    assert {c[0] for c in combos} == {"rmsnorm", "layernorm"}
    assert {c[1] for c in combos} == {"pre", "post"}
    assert {c[2] for c in combos} == {300, 1000, 3000}  # >= 3 budgets spanning >= 10x
    assert len(lrs) == 5 and min(lrs) == 3.16e-3 and max(lrs) == 0.316
    assert {c[4] for c in combos} == {0, 1, 2}
    p = study.protocol
    assert p.selection_seeds == (0, 1, 2) and set(p.test_seeds).isdisjoint(p.selection_seeds)
    assert len(p.common_seeds) == 16 and set(p.common_seeds).isdisjoint(p.selection_seeds)
    assert p.adaptive is not None and p.adaptive.max_runs == 120
    assert {c["metric"] for c in study.claims} == {"lr50", "lr_sensitivity", "common_loss"}
    # 4 claims x 2 pairs x 3 budgets: the family the adaptive stop rule and the file's text use
    assert sum(max(1, len(protocol.arm_pairs(study, c))) for c in study.claims) == 24
    assert "0.05 / 24" in (STUDIES / "norm-placement-lr.yaml").read_text()
    assert study.rule.learn_margin == 0.25 and len(study.alternatives) == 2
    assert study.equivalence_margin == 0.02 and study.margin_reason
    assert runs[0]["name"].startswith("rmsnorm-pre-")
    other = studyfile.load_study(STUDIES / "norm-placement-lr-pystdlib.yaml")
    for key in ("grid", "protocol", "claims", "rule", "equivalence_margin"):
        assert getattr(other, key) == getattr(study, key), key
    assert other.overrides["data"] == {**study.overrides["data"], "source": "pystdlib"}


def test_exclude_drops_grid_combinations_from_the_runs_the_arms_and_the_claims(tmp_path):
    """Arms whose fields go together (DyT with its recipe's scalar, RMSNorm without) are a grid less
    exclusions: the runs, the protocol's arms and a claim's arm pairs leave them out; an exclusion
    names grid values only."""
    path = tmp_path / "s.yaml"
    head = (
        f"config: {CONFIGS / 'tiny.yaml'}\ngrid: "
        f"{{norm: [rmsnorm, dyt], model.embed_scale: [none, sqrt_dim], "
        "lr: [0.001, 0.01]}\n"
    )
    path.write_text(
        head + "exclude: [{norm: dyt, model.embed_scale: none}, {norm: rmsnorm, "
        "model.embed_scale: sqrt_dim}]\nprotocol: {selection_seeds: [0], test_seeds: [1]}\n"
        "claims: [{paper: p, says: s, a: {norm: dyt, model.embed_scale: sqrt_dim}, b: {norm: "
        "rmsnorm, model.embed_scale: none}, metric: best_loss, expect: same}, {paper: p, says: s, "
        "a: {norm: dyt}, b: {norm: rmsnorm}, metric: best_loss, expect: same}]\n"
    )
    study = studyfile.load_study(path)
    one_seed = dataclasses.replace(study, grid={**study.grid, "train.seed": [0]})
    assert [r["name"] for r in studyfile.expand(one_seed)] == [
        "rmsnorm-embed_scalenone-lr0.001-s0",
        "rmsnorm-embed_scalenone-lr0.01-s0",
        "dyt-embed_scalesqrt_dim-lr0.001-s0",
        "dyt-embed_scalesqrt_dim-lr0.01-s0",
    ]
    arms = [
        {"model.norm": "rmsnorm", "model.embed_scale": "none"},
        {"model.norm": "dyt", "model.embed_scale": "sqrt_dim"},
    ]
    assert protocol.arms_of(study) == arms
    assert len(protocol.first_runs(study)) == 4  # the grid on the selection seed, the two arms only
    assert protocol.arm_pairs(study, study.claims[0]) == [
        (arms[1], arms[0])
    ]  # dyt/sqrt_dim vs rmsnorm/none
    # a claim's unnamed fields are equal in its two arms: one that leaves out a field the exclusions
    # tie pairs none
    assert protocol.arm_pairs(study, study.claims[1]) == []
    for bad, says in [
        ("exclude: [{norm: layernorm}]\n", "model.norm='layernorm' is not a value of the grid"),
        ("exclude: [{lr: 0.01}]\n", "optim.lr=0.01 is not a value of the grid"),
        ("exclude: {norm: dyt}\n", "exclude is a list of mappings"),
    ]:
        path.write_text(head + bad)
        with pytest.raises(ConfigError, match=says):
            studyfile.load_study(path)


@pytest.mark.slow
def test_the_dyt_study_separates_the_norm_from_the_embedding_scalar():
    """lab/studies/dyt.yaml (issues 35, 40): at the paper's init scale transposed to d = 64, DyT
    and RMSNorm each with the recipe's embedding scalar and without it, the scalar pair again at 4x
    the steps; every claim compares two norms with the same scalar; the first study's verdict
    withdrawn; a quick version of 8 runs."""
    study = studyfile.load_study(STUDIES / "dyt.yaml")
    arms = {
        (a["model.norm"], a["model.embed_scale"], a["train.steps"]) for a in protocol.arms_of(study)
    }
    assert arms == {
        (norm, scalar, 300) for norm in ("dyt", "rmsnorm") for scalar in ("none", "sqrt_dim")
    } | {("dyt", "sqrt_dim", 1200), ("rmsnorm", "sqrt_dim", 1200)}
    runs = protocol.first_runs(study)
    assert len(runs) == 60  # 6 arms x 5 LRs x 2 selection seeds: --dry-run's count
    cfg = load_config(
        study.config, next(r["overrides"] for r in runs if r["name"].startswith("dyt-"))
    )
    assert (
        cfg.model.dim == 64
        and cfg.model.init_scale == "width"
        and cfg.model.norm_options
        == {"dyt": {"alpha_attn": 0.8, "alpha_ffn": 0.2, "alpha_final": 0.2, "bias": False}}
    )
    assert (cfg.model.norm_impl, cfg.model.ops_impl) == ("fused", "fused")
    # 0.02 x sqrt(4096 / 64)
    assert cfg.model.matrix_std == cfg.model.head_std == pytest.approx(0.16)
    lrs = study.grid["optim.lr"]
    assert {3.16e-2, 1.0e-1} <= set(lrs) and study.protocol.max_lr >= 0.1
    assert len(study.protocol.common_seeds) == 10
    assert {c["metric"] for c in study.claims} == {"common_loss", "best_loss"}
    for c in study.claims:
        pairs = protocol.arm_pairs(study, c)
        assert pairs and c["expect"] == "same"
        for a, b in pairs:  # the same scalar and budget on both sides: only the norm differs
            assert {k for k in a if a[k] != b[k]} == {"model.norm"}
    assert study.withdrawn and "absorbing" in study.withdrawn[0]["why"]
    assert "stream's scale does too" in (STUDIES / "dyt.yaml").read_text()
    assert len(studyfile.expand(studyfile.quick_study(study))) == 8


def test_bad_study_values_fail_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"config: {CONFIGS / 'tiny.yaml'}\ngrid: {{norm: [rmsnorm, groupnorm]}}\n")
    with pytest.raises(ConfigError, match="model.norm='groupnorm' is not one of"):
        studyfile.expand(studyfile.load_study(bad))
    assert sweep([str(bad), "--out", str(tmp_path / "out")]) == 2
    assert (
        "error: model.norm='groupnorm'" in capsys.readouterr().err
        and not (tmp_path / "out").exists()
    )


@pytest.mark.parametrize(
    "text,message",
    [
        ("grid: [1, 2\n", "cannot parse"),
        ("grid: [1, 2]\n", "a 'grid' mapping"),
        ("grid: {lr: [0.1]}\nthreads_per_worker: 0\n", "must be an integer >= 1"),
    ],
)
def test_malformed_study_files_are_one_line(tmp_path, capsys, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert sweep([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.fixture
def data_set(prepared):
    meta = json.loads((prepared / "meta.json").read_text())
    return [
        "--set",
        f"data.source={meta['source']}",
        f"data.root={prepared.parent}",
        "data.vocab_size=320",
        "data.val_fraction=0.1",
    ]


@pytest.mark.slow
def test_quick_study_end_to_end_then_skips_finished_runs(tmp_path, data_set, capsys):
    out = tmp_path / "studies"
    data_set = [
        *data_set,
        "train.steps=30",
        "train.eval_every=15",
    ]  # the synthetic corpus needs fewer steps
    assert sweep([str(STUDIES / "quick.yaml"), "--out", str(out), *data_set]) == 0
    study = out / "quick"
    index = json.loads((study / "sweep.json").read_text())["runs"]
    assert len(index) == 8 and all(e["status"] in ("ok", "plateau") for e in index)
    report = (study / "report.md").read_text()
    for fig in (
        "loss_curves",
        "grad_norm_curves",
        "stability_map",
        "grad_heatmaps",
        "act_rms_depth",
        "attn_logit_max",
    ):
        assert (study / f"{fig}.png").stat().st_size > 1000 and f"({fig}.png)" in report
    for arm in ("rmsnorm/pre", "rmsnorm/post", "layernorm/pre", "layernorm/post"):
        assert f"| {arm} |" in report
    # the bits-per-byte factor the runs measured is the one counted on their eval set's bytes
    from conftest import eval_bits_per_nat

    from training.config import load_config

    run = next(study.glob("runs/*/config.yaml"))
    measured = json.loads((study / "report.json").read_text())["bits_per_nat"]
    assert measured == pytest.approx(eval_bits_per_nat(load_config(run)), rel=1e-9)
    stamps = {p: p.stat().st_mtime_ns for p in study.glob("runs/*/metrics.jsonl")}
    capsys.readouterr()
    assert sweep([str(STUDIES / "quick.yaml"), "--out", str(out), *data_set, "--no-report"]) == 0
    assert "8 already finished, 0 to run" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in study.glob("runs/*/metrics.jsonl")}
    # the machine is wiped: its finished runs, packed and unpacked on the next, are not run again
    part, n = pack(study, tmp_path / "pending")
    assert n == 8 and pack(study, tmp_path / "pending") == (None, 0)
    unpack(part.parent, tmp_path / "next")
    assert sweep([str(STUDIES / "quick.yaml"), "--out", str(tmp_path / "next"), *data_set]) == 0
    assert "8 already finished, 0 to run" in capsys.readouterr().out
    again = json.loads((tmp_path / "next" / "quick" / "report.json").read_text())
    first = json.loads((study / "report.json").read_text())
    for key in ("runs", "arms", "per_arm", "comparisons", "claims"):  # what the runs decide
        assert again[key] == first[key], key


@pytest.mark.slow
def test_diverging_and_failing_runs_do_not_stop_the_sweep(tmp_path, data_set):
    study = tmp_path / "s.yaml"
    study.write_text(
        f"name: s\nconfig: {CONFIGS / 'tiny.yaml'}\n"
        "overrides: {optim: {grad_clip: 0, warmup_steps: 0}, train: {steps: 12, sample_tokens: "
        "0}}\n"
        "grid: {lr: [3.0e-3, 1.0e+4], train.seq_len: [32, 100000]}\n"
    )
    assert sweep([str(study), "--out", str(tmp_path), *data_set, "--no-report"]) == 0
    index = {e["name"]: e for e in json.loads((tmp_path / "s" / "sweep.json").read_text())["runs"]}
    assert index["lr0.003-seq_len32"]["status"] in ("ok", "plateau")
    assert (
        index["lr10000.0-seq_len32"]["status"] == "diverged"
        and index["lr10000.0-seq_len32"]["exit_code"] == 3
    )
    failed = index["lr0.003-seq_len100000"]
    assert (
        failed["status"] == "failed" and failed["exit_code"] == 2 and "too few" in failed["error"]
    )
    # resuming an interrupted run: fake one by removing a finished run's summary (its checkpoint
    # stays)
    (tmp_path / "s" / "runs" / "lr0.003-seq_len32" / "summary.json").unlink()
    assert runner.state(tmp_path / "s" / "runs" / "lr0.003-seq_len32") == "resume"


def _arms(root):
    keys, grouped = study_runs.group_arms(study_runs.find_runs([root]))
    return keys, {label: arms.Arm(label, runs) for label, runs in grouped.items()}


@pytest.mark.slow
def test_compare_computes_hand_checkable_numbers(tmp_path):
    rows = [  # arm rmsnorm trains at 1e-3 and 1e-2 (best), diverges at 1e-1
        ("rmsnorm", 1e-3, [(3.0, "ok"), (3.2, "ok")]),
        ("rmsnorm", 1e-2, [(2.0, "ok"), (2.2, "ok")]),
        ("rmsnorm", 1e-1, [(None, "diverged"), (None, "diverged")]),
        # arm layernorm: 3.0, 2.5 (train.py's plateau label; 1.5 nats below the unigram entropy, so
        # trained under the study's rule), then above L0 (a failure, not a loss)
        ("layernorm", 1e-3, [(3.0, "ok"), (3.0, "ok")]),
        ("layernorm", 1e-2, [(2.5, "plateau"), (2.5, "plateau")]),
        ("layernorm", 1e-1, [(6.0, "unstable"), (6.0, "unstable")]),
    ]
    for norm, lr, seeds in rows:
        for seed, (final, status) in enumerate(seeds):
            write_run(tmp_path, f"{norm}-{lr}-{seed}", norm, lr, seed, status, final)
    keys, arms = _arms(tmp_path)
    assert keys == ["model.norm"]
    rms, ln = arms["rmsnorm"], arms["layernorm"]
    assert rms.l0 == pytest.approx(5.0)  # the step-0 val loss
    assert rms.losses(1e-1) == {} and ln.losses(1e-1) == {} and ln.losses(1e-2) == {0: 2.5, 1: 2.5}
    assert protocol.select_lr(rms.runs, [0]) == 1e-2 and protocol.select_lr(ln.runs, [0]) == 1e-2
    assert rms.max_lr_ok == 1e-2 and ln.max_lr_ok == 1e-2
    assert rms.outcomes() == {
        "ok": 4,
        "plateau": 0,
        "collapsed": 0,
        "unstable": 0,
        "diverged": 2,
        "interrupted": 0,
        "failed": 0,
    }
    fit = rms.failure()
    # 0/2 then 2/2: completely separated, a bracket (whatever the penalised fit says)
    assert (
        not fit.identified
        and fit.bounds == (1e-2, 1e-1)
        and fit.ends == ((0, 2), (2, 2))
        and fit.failed == 2
    )
    assert ln.outcomes()["plateau"] == 2 and ln.tokens_per_s() == 1500.0
    text = write_report([tmp_path], tmp_path / "out", margin=0.02).read_text()
    # two seeds and no protocol: seed 0 chooses the LR, seed 1 tests it
    assert "Selection seeds 0, test seeds 1" in text
    assert "| rmsnorm | 0.01 | 2.000 / 2.200 |" in text  # per-seed values, never a mean +- std
    # exploratory, paired seed by seed
    assert "| layernorm | rmsnorm | model.norm | 0.01 | 2 | +0.400 |" in text
    # both failed: no loss to compare
    assert "| layernorm | rmsnorm | model.norm | 0.1 | 0 | - |" in text
    assert "**rmsnorm**: 2 of 6 runs failed under the study's rule (at lr 0.1)." in text
    # no study file: the report says so and judges by train.py's own labels (plateau trains,
    # diverged fails)
    assert "No study file was given: a run failed if it had train.py's own label" in text
    assert "fixed in the study file" not in text
    assert (
        "| rmsnorm-0.1-0 | diverged | - | - | 2 | 5.000 | 1,000 | failed: train.py: diverged |"
        in text
    )
    for fig in (
        "loss_curves",
        "grad_norm_curves",
        "stability_map",
        "final_loss",
        "grad_heatmaps",
        "act_rms_depth",
        "attn_logit_max",
        "loss_vs_lr",
    ):
        assert (tmp_path / "out" / f"{fig}.png").stat().st_size > 1000


def _two_arms(root, finals_a, finals_b, lr=1e-2, status_a=None, status_b=None, selection=(0,)):
    """rmsnorm (a) and layernorm (b) at one LR, seed by seed; the protocol's selection seeds choose,
    the rest test."""
    for seed, (fa, fb) in enumerate(zip(finals_a, finals_b, strict=True)):
        write_run(root, f"rms-{seed}", "rmsnorm", lr, seed, (status_a or ["ok"] * 9)[seed], fa)
        write_run(root, f"ln-{seed}", "layernorm", lr, seed, (status_b or ["ok"] * 9)[seed], fb)
    test = [s for s in range(len(finals_a)) if s not in selection]
    (root / "study.yaml").write_text(
        f"name: c\nconfig: {CONFIGS / 'tiny.yaml'}\ngrid: {{norm: [rmsnorm, layernorm], "
        f"lr: [{lr}]}}\nprotocol: {{selection_seeds: {list(selection)}, test_seeds: "
        f"{test or [99]}}}\n"
    )
    return write_report([root], root / "out", margin=0.02, draw=False).read_text()


def _sentence(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"- {start}"))


@pytest.mark.parametrize(
    "case,finals_b,verdict",
    [
        ("equivalent", [3.0, 3.201, 2.898, 3.102, 3.001, 2.95], "equivalent within +-0.02"),
        ("different", [3.0, 3.31, 3.0, 3.22, 3.09, 3.06], ": different (TOST"),
        ("inconclusive", [3.0, 2.9, 3.2, 2.8, 3.25, 2.7], ": inconclusive (TOST"),
    ],
)
@pytest.mark.slow
def test_report_sentences_on_constructed_runs(tmp_path, case, finals_b, verdict):
    """Arms constructed with a known paired difference on the test seeds 1-5 (seed 0 only chooses
    the LR): the sentence states n, the CI and the test's verdict."""
    text = _two_arms(tmp_path, [3.0, 3.2, 2.9, 3.1, 3.0, 2.95], finals_b)
    line = _sentence(
        text, "layernorm - rmsnorm, each at its best LR (0.01, 0.01; chosen on seeds 0)"
    )
    assert (
        verdict in line
        and "n = 5 seeds" in line
        and "95% CI" in line
        and "minimum detectable" in line
    )


@pytest.mark.slow
def test_report_on_split_failed_and_one_seed(tmp_path):
    # split: one seed learns, the other collapses at the same LR -> said per seed, no mean is taken
    # across them
    text = _two_arms(
        tmp_path / "bi",
        [3.3, 5.9],
        [3.4, 5.8],
        status_a=["ok", "collapsed"],
        status_b=["ok", "collapsed"],
    )
    split = _sentence(text, "**rmsnorm** at lr 0.01 splits:")
    assert (
        "seed 0 trained 3.300" in split
        and "seed 1 failed (did not learn: best 5.90 > unigram 4.00 - 0.25)" in split
        and "no mean is taken" in split
    )
    assert (
        "+-" not in text.split("## Arms compared")[0].split("| arm |")[1]
    )  # the table has no mean +- std
    # a test seed where one arm failed is left out of the loss comparison and named
    text = _two_arms(
        tmp_path / "drop",
        [3.0, 3.1, 3.2, 3.0],
        [3.1, 3.2, 5.9, 3.1],
        status_b=["ok", "ok", "collapsed", "ok"],
    )
    line = _sentence(text, "layernorm - rmsnorm, each at its best LR")
    assert (
        "n = 2 seeds" in line
        and "left out (a run failed): seed 2: layernorm failed (did not learn" in line
    )
    # all diverged: no loss to compare, no failure curve to fit
    text = _two_arms(
        tmp_path / "div",
        [None, None],
        [None, None],
        status_a=["diverged"] * 2,
        status_b=["diverged"] * 2,
    )
    assert "2 of 2 runs failed under the study's rule" in text and "no loss comparison" in text
    assert (
        "LR50 ratio not bounded (an arm's LR50 is only bracketed: no estimate; 4 runs, 4 failed)"
        in text
    )
    # one seed: it chooses; nothing is left to test on
    text = _two_arms(tmp_path / "one", [3.0], [3.1])
    assert "no test seed: seed 0 chose each arm's LR" in _sentence(
        text, "layernorm - rmsnorm: no loss comparison"
    )


def test_compare_rejects_a_directory_without_runs(tmp_path, capsys):
    assert compare([str(tmp_path)]) == 2
    assert "no run directories" in capsys.readouterr().err


def _claims_study(
    root: Path, claims: str, diffs: list[float], post_diffs: list[float] | None = None
):
    """rmsnorm / layernorm x pre (/ post) at one lr, 5 seeds; layernorm = rmsnorm + diffs[seed] (per
    placement)."""
    base = [3.0, 3.2, 2.9, 3.1, 3.0]
    for placement, ds in (("pre", diffs), ("post", post_diffs)):
        for seed, d in enumerate(ds or []):
            write_run(
                root,
                f"rms-{placement}-{seed}",
                "rmsnorm",
                1e-2,
                seed,
                "ok",
                base[seed],
                placement=placement,
            )
            write_run(
                root,
                f"ln-{placement}-{seed}",
                "layernorm",
                1e-2,
                seed,
                "ok",
                base[seed] + d,
                placement=placement,
            )
    (root / "study.yaml").write_text(
        f"name: c\nconfig: {CONFIGS / 'tiny.yaml'}\ngrid:\n  norm: [rmsnorm, layernorm]\n"
        f"  placement: [pre, post]\n  lr: [1.0e-2]\nprotocol: {{selection_seeds: [0], "
        f"test_seeds: [1, 2, 3, 4]}}\nclaims:\n{claims}"
    )
    write_report([root], root / "out", margin=0.02, draw=False)
    return json.loads((root / "out" / "report.json").read_text())["claims"], (
        root / "out" / "report.md"
    ).read_text()


CLAIM = (
    "  - {{paper: P et al., says: S, a: {{norm: layernorm{extra}}}, b: {{norm: rmsnorm{extra}}}, "
    "metric: best_loss, "
    "expect: {expect}}}\n"
)
WORSE = [0.10, 0.12, 0.09, 0.11, 0.10]  # layernorm clearly higher
SAME = [0.001, -0.002, 0.0015, -0.001, 0.0005]
NOISY = [0.3, -0.25, 0.1, -0.4, 0.2]


@pytest.mark.parametrize(
    "diffs,expect,agreement",
    [
        (WORSE, "higher", "agrees"),
        (WORSE, "lower", "disagrees"),
        (WORSE, "same", "disagrees"),
        (SAME, "same", "agrees"),
        (SAME, "higher", "cannot tell"),
        (NOISY, "higher", "cannot tell"),
        (NOISY, "same", "cannot tell"),
    ],
)
@pytest.mark.slow
def test_claims_are_decided_by_their_primary_test_alone(tmp_path, diffs, expect, agreement):
    """Seed 0 chooses, seeds 1-4 test. `higher` is decided by the paired t test (a shown equivalence
    does not make it `disagrees`: that would be a second test); `same` by TOST, or `disagrees` when
    the CI lies outside the margin (its mirror test, through Holm); NOISY decides nothing (`cannot
    tell`)."""
    results, text = _claims_study(
        tmp_path, CLAIM.format(extra=", placement: pre", expect=expect), diffs
    )
    assert [(r["A"], r["B"], r["agreement"], r["loss"]["n"]) for r in results] == [
        ("layernorm", "rmsnorm", agreement, 4)
    ]
    line = _sentence(text, "**P et al.**: S")
    assert f"**{agreement}**" in line and "95% CI" in line and "n = 4 seeds" in line
    assert "Holm-adjusted" in line  # every claim is in the family


@pytest.mark.slow
def test_a_claim_ranges_over_the_fields_it_does_not_name(tmp_path):
    results, text = _claims_study(
        tmp_path, CLAIM.format(extra="", expect="higher"), WORSE, post_diffs=SAME
    )
    assert sorted((r["A"], r["B"], r["agreement"]) for r in results) == [
        ("layernorm/post", "rmsnorm/post", "cannot tell"),
        ("layernorm/pre", "rmsnorm/pre", "agrees"),
    ]
    assert "## Claims (pre-registered)" in text and "Holm-adjusted over the family of all 2" in text


@pytest.mark.slow
def test_a_claim_no_run_matches_says_not_run(tmp_path):
    results, _ = _claims_study(
        tmp_path, CLAIM.format(extra=", placement: post", expect="higher"), WORSE
    )
    assert [r["agreement"] for r in results] == ["not run"]


@pytest.mark.parametrize(
    "claim,message",
    [
        (
            "{paper: P, says: S, a: {norm: rmsnorm}, b: {norm: layernorm}, metric: best_loss}",
            "needs exactly",
        ),
        (
            "{paper: P, says: S, a: {norm: batchnorm}, b: {norm: layernorm}, metric: best_loss, "
            "expect: same}",
            "norm='batchnorm' is not a value of the grid",
        ),
        (
            "{paper: P, says: S, a: {lr: 0.01}, b: {lr: 0.1}, metric: best_loss, expect: same}",
            "is not a value of the grid",
        ),
        (
            "{paper: P, says: S, a: {norm: rmsnorm}, b: {norm: layernorm}, metric: speed, expect: "
            "same}",
            "metric is one",
        ),
        (
            "{paper: P, says: S, a: {norm: rmsnorm}, b: {norm: rmsnorm}, metric: best_loss, "
            "expect: same}",
            "the same arm",
        ),
        (
            "{paper: P, says: S, a: {norm: rmsnorm}, b: {norm: layernorm}, metric: lr50, expect: "
            "more}",
            "expect one of",
        ),
    ],
)
def test_bad_claims_are_one_line_before_anything_runs(tmp_path, capsys, claim, message):
    bad = tmp_path / "s.yaml"
    bad.write_text(
        f"name: s\ngrid: {{norm: [rmsnorm, layernorm], lr: [0.01, 0.1], seed: [0]}}\nclaims:\n  - "
        f"{claim}\n"
    )
    assert sweep([str(bad), "--out", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_norm_input_findings_on_constructed_records(tmp_path):
    write_run(tmp_path, "a", "rmsnorm", 1e-2, 0, "ok", 3.0)
    path = tmp_path / "runs" / "a" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    # steps 1, 2, 3
    for r, (mean, rms) in zip(records[1:], [(0.9, 1.0), (0.5, 1.0), (0.4, 2.0)], strict=True):
        r.update(
            {
                "norm_in/mean/layer_0": mean,
                "norm_in/mean/layer_1": mean / 2,
                "norm_in/rms/layer_0": rms,
                "norm_in/rms/layer_1": rms,
                "norm_in/absmax/layer_0": 300.0,
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    keys, arms = _arms(tmp_path)
    arms["all"].best_lr = 1e-2
    from lab.findings import norm_input_findings

    lines = norm_input_findings(arms, ["model.norm_precision"])
    # (0.9 + 0.45) / 2 / 1.0 at step 1; (0.4 + 0.2) / 2 / 2.0 at step 3
    assert "all 0.68 -> 0.15" in lines[0]
    assert "0.14 is chance" in lines[0]  # sqrt(2 / (pi * 32)), the width read from the runs' config
    assert "all 300.0" in lines[1]
    # a width study: chance differs per arm, so each width's is stated
    wide = copy.deepcopy(arms["all"])
    wide.label, wide.runs[0].config["model.dim"] = "wide", 64
    line = norm_input_findings({"all": arms["all"], "wide": wide}, [])[0]
    assert (
        "chance, E|mean| / RMS of zero-mean d-dim vectors, is 0.14 at d = 32, 0.10 at d = 64)"
        in line
    )


# The study files whose quick versions run end to end here: the protocol's stages with the common LR
# and failure seeds, every claim metric, exclusions, the DyT saturation figure. The other report
# parts (log Z figures, width trends, qk-norm arms) are tested on constructed runs (test_logits.py,
# the width tests below); every other file's quick version is checked without running (below): its
# grid expands, its claims parse, `--quick --dry-run` lists it.
RUN_QUICK = ("norm-placement-lr", "dyt")


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_study_configs_quick_version_expands_and_lists(tmp_path, path, capsys):
    study = studyfile.load_study(path)
    if study.quick is None:
        assert path.stem == "quick"  # the smoke study is already quick
        return
    quick = studyfile.quick_study(study)
    assert studyfile.expand(quick) and all(c.get("metric") for c in quick.claims)
    assert sweep([str(path), "--quick", "--dry-run", "--out", str(tmp_path)]) == 0
    assert f"{len(studyfile.expand(quick))} runs -> " in capsys.readouterr().out


def test_the_quick_studies_run_here_exist():
    assert all((STUDIES / f"{name}.yaml").is_file() for name in RUN_QUICK)


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_QUICK)
def test_representative_study_configs_run_their_quick_version(tmp_path, data_set, name):
    path = STUDIES / f"{name}.yaml"
    study = studyfile.load_study(path)
    assert sweep([str(path), "--quick", "--out", str(tmp_path), *data_set]) == 0
    out = tmp_path / f"{study.name}-quick"
    report = json.loads((out / "report.json").read_text())
    assert report["runs"] == len(studyfile.expand(studyfile.quick_study(study)))
    assert all(
        r["agreement"] in ("agrees", "disagrees", "cannot tell", "not run")
        for r in report["claims"]
    )
    assert len(report["claims"]) >= len(studyfile.quick_study(study).claims)
    assert "## What the numbers show" in (out / "report.md").read_text()


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


@pytest.mark.slow
def test_a_slurm_array_run_as_local_processes_reports_what_a_local_sweep_does(tmp_path, data_set):
    """The sbatch script's tasks (each `sweep.py --shard i/N`), run here as concurrent processes on
    one shared folder, write the same runs as one local sweep: equal per-run results and paired
    comparisons."""
    study_file = tmp_path / "study.yaml"  # 2 runs: two arms at one LR, paired by seed 0
    study_file.write_text(
        f"name: quick\nconfig: {CONFIGS / 'tiny.yaml'}\noverrides:\n  train: {{steps: 24, "
        "eval_every: 12, checkpoint_every: 0, sample_tokens: 0}\ngrid:\n  norm: [rmsnorm, "
        "layernorm]\n  lr: [3.0e-3]\n  seed: [0]\nthreads_per_worker: 1\n"
    )
    assert sweep([str(study_file), "--out", str(tmp_path / "local"), "--no-report", *data_set]) == 0
    script = tmp_path / "array.sbatch"
    argv = [str(study_file), "--out", str(tmp_path / "shared"), "--slurm", str(script), *data_set]
    assert sweep(argv) == 0
    text = script.read_text()
    assert "#SBATCH --array=0-1" in text and "--shard ${SLURM_ARRAY_TASK_ID}/2" in text
    command = text.strip().splitlines()[-1]
    tasks = [
        subprocess.Popen(
            ["bash", "-c", command],
            env={**os.environ, "SLURM_ARRAY_TASK_ID": str(i)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in tasks:  # both tasks at once, on the one shared folder
        assert p.wait(timeout=600) == 0, p.stderr.read()[-2000:]
    shared = tmp_path / "shared" / "quick"
    assert len(list(shared.glob("sweep-*-of-2.json"))) == 2 and not (shared / "report.md").exists()
    local = tmp_path / "local" / "quick"
    runs = [p.parent for p in (local / "runs").glob("*/summary.json")]
    assert len(runs) == 2
    for run in runs:
        a = json.loads((run / "summary.json").read_text())
        b = json.loads((shared / "runs" / run.name / "summary.json").read_text())
        assert a["final_val_loss"] == b["final_val_loss"] and a["status"] == b["status"], run.name
    from lab.report import compute, render  # the report's text (its figures are tested elsewhere)

    mine, theirs = (render(compute([d]), []) for d in (local, shared))
    assert "| layernorm | rmsnorm | model.norm |" in _section(mine, "Arms compared")
    for title in ("Arms compared", "Per-LR paired differences (exploratory)"):
        assert _section(mine, title) == _section(theirs, title)


def test_bad_shard_is_one_line(tmp_path, capsys):
    assert sweep([str(STUDIES / "quick.yaml"), "--out", str(tmp_path), "--shard", "2/2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --shard 2/2: need 0 <= K < N (K counts from 0, like SLURM_ARRAY_TASK_ID)"


def test_runs_from_before_a_field_existed_read_as_its_default(tmp_path):
    """A config field added later (with the old behaviour as its default) must not split old and new
    runs."""
    for seed in (0, 1):
        write_run(tmp_path, f"old-{seed}", "rmsnorm", 1e-2, seed, "ok", 3.0)
        write_run(tmp_path, f"new-{seed}", "rmsnorm", 1e-3, seed, "ok", 3.1)
    for seed in (0, 1):
        path = tmp_path / "runs" / f"old-{seed}" / "config.yaml"
        path.write_text(path.read_text().replace("  ffn: swiglu\n", ""))
        assert "  ffn:" not in path.read_text()
    keys, arms = _arms(tmp_path)
    assert keys == [] and len(arms["all"].runs) == 4


@pytest.mark.slow
def test_best_loss_claims_pair_each_arm_at_its_own_best_lr(tmp_path):
    """rmsnorm is best at lr 1e-2 (3.0 + s/10), layernorm at 1e-3 (3.05 + s/10): paired by seed
    across the two LRs the difference is +0.05 every seed (different), while at any one shared LR it
    would be far larger."""
    for seed in range(4):
        for norm, best, value in (("rmsnorm", 1e-2, 3.0), ("layernorm", 1e-3, 3.05)):
            for lr in (1e-3, 1e-2):
                write_run(
                    tmp_path,
                    f"{norm}-{lr}-{seed}",
                    norm,
                    lr,
                    seed,
                    "ok",
                    value + seed / 10 + (0 if lr == best else 1.0),
                )
    (tmp_path / "study.yaml").write_text(
        f"name: c\nconfig: {CONFIGS / 'tiny.yaml'}\ngrid: "
        f"{{norm: [rmsnorm, layernorm], lr: [0.001, 0.01], "
        "seed: [0, 1, 2, 3]}\nclaims:\n  - {paper: P, says: S, a: {norm: layernorm}, b: {norm: "
        "rmsnorm}, "
        "metric: best_loss, expect: higher}\n"
    )
    write_report([tmp_path], tmp_path / "out", margin=0.02, draw=False)
    (r,) = json.loads((tmp_path / "out" / "report.json").read_text())[
        "claims"
    ]  # seeds 0-1 choose, 2-3 test
    assert (
        r["lrs"] == [1e-3, 1e-2]
        and r["estimate"] == pytest.approx(0.05)
        and r["agreement"] == "agrees"
    )
    assert r["loss"]["n"] == 2


def test_wall_time_counts_only_time_with_runs_in_flight(tmp_path):
    for name, start, seconds in (
        ("a", "2026-01-01T10:00:00", 60),
        ("b", "2026-01-01T10:00:30", 60),
        ("c", "2026-01-01T11:00:00", 30),
    ):  # a and b overlap; c runs an hour later
        write_run(tmp_path, name, "rmsnorm", 1e-2, 0, "ok", 3.0)
        (tmp_path / "runs" / name / "meta.json").write_text(json.dumps({"started": start}))
        summary = tmp_path / "runs" / name / "summary.json"
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "wall_time_s": seconds}))
    assert wall_span(study_runs.find_runs([tmp_path])) == 90 + 30


def test_a_study_made_by_several_builds_says_so_and_one_made_by_one_does_not(tmp_path):
    """A study resumed on another machine (lab/pack.py) mixes kernel builds: the report counts the
    runs each made (meta.json); runs of one build, or without meta.json, add no line."""
    from lab.report import compute, render

    build = lambda name: {"torch": "2.13.0+cpu", "kernels": {"build": {"name": name}}}  # noqa: E731
    for i, made in enumerate(["native_a", "native_a", "native_b", None]):
        for norm in ("rmsnorm", "layernorm"):
            write_run(tmp_path, f"{norm}-s{i}", norm, 1e-2, i, "ok", 3.0 + i / 10)
            meta = build(made) if made else {"torch": "2.13.0+cpu", "kernels": {}}
            (tmp_path / "runs" / f"{norm}-s{i}" / "meta.json").write_text(json.dumps(meta))
    res = compute([tmp_path])
    assert res.builds == [
        {"build": "torch 2.13.0+cpu, native_a", "runs": 4},
        {"build": "torch 2.13.0+cpu, native_b", "runs": 2},
        {"build": "torch 2.13.0+cpu, no fused kernels", "runs": 2},
    ]
    assert (
        "Its runs were made by 3 builds (meta.json: torch and the fused kernels, whose build name "
        "hashes the CPU of a -march=native build): 4 runs by torch 2.13.0+cpu, native_a; 2 runs"
    ) in render(res, [])
    for i in (2, 3):  # every run by one build
        for norm in ("rmsnorm", "layernorm"):
            path = tmp_path / "runs" / f"{norm}-s{i}" / "meta.json"
            path.write_text(json.dumps(build("native_a")))
    res = compute([tmp_path])
    assert res.builds == [{"build": "torch 2.13.0+cpu, native_a", "runs": 8}]
    assert "builds (meta.json" not in render(res, [])


@pytest.mark.slow
def test_gpu_study_dry_run_states_its_expected_time_from_the_models_flops(capsys):
    """gpt2-124m: 12 x (4 x 768^2 + 3 x 768 x 2560) + 768 x 32000 = 123,666,432 matmul parameters;
    per token 6 N + 12 x 12 x 768 x 1024 = 855,244,800 FLOPs; x 512 x 1024 x 2000 tokens x 24 runs =
    2.15e19; over 8 H100s at 40% of 989 TFLOP/s: 6,800 s = 1.9 h."""
    assert sweep([str(STUDIES / "gpu-norm-placement-lr.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "expected: 2.15e+19 training FLOPs over 24 runs = 1.9 h on 8 x H100 at 40% MFU (0.63 GPU-h "
        "per run)" in out
    )


def test_a_report_says_what_its_study_asks_in_one_sentence(tmp_path):
    (tmp_path / "study.yaml").write_text(
        "# A comment is not what it asks.\nname: x\n"
        "about: Does Post-LN get worse with depth?\ngrid: {lr: [0.1]}\n"
    )
    assert studyfile.study_file([tmp_path]).about == "Does Post-LN get worse with depth?"


def test_a_report_judges_every_run_again_with_the_current_rules(tmp_path):
    """train.py's label is judged again from the curve (a `plateau` stuck at the unigram level reads
    `collapsed`; one still falling stays `plateau`), but the study's rule decides: neither got 0.25
    nats below the unigram entropy within its budget, so both failed, whatever their last slope."""
    for name, curve in (
        ("stuck", [5.914, 5.927, 5.904, 5.884, 5.879]),
        ("falling", [6.5, 6.1, 6.0, 5.8, 5.7]),
    ):
        write_run(tmp_path, name, "rmsnorm", 1e-2, 0, "plateau", curve[-1], l0=6.9)
        path = tmp_path / "runs" / name
        (path / "metrics.jsonl").write_text(
            "".join(
                json.dumps({"step": s, "val/loss": v}) + "\n"
                for s, v in zip((0, 100, 200, 300, 400, 500), [6.9, *curve], strict=True)
            )
        )
        summary = json.loads((path / "summary.json").read_text())
        (path / "summary.json").write_text(json.dumps({**summary, "unigram_entropy": 5.88}))
    runs = {r.name: r for r in study_runs.find_runs([tmp_path])}
    assert (
        runs["stuck"].status == "collapsed" and runs["stuck"].failed and runs["stuck"].loss is None
    )
    assert (
        runs["falling"].status == "plateau"
        and runs["falling"].failed
        and runs["falling"].loss is None
    )
    assert runs["falling"].why == "did not learn: best 5.70 > unigram 5.88 - 0.25"


@pytest.mark.slow
def test_a_committed_study_is_decided_again_from_its_archived_runs(tmp_path):
    """runs.json (what a report writes beside itself) and, for older reports, the Runs table of
    report.md give back the same runs, with their configs rebuilt from the study file's grid."""
    from lab.archive import archived_runs

    for seed in range(3):
        for norm, lr, status, final in (
            ("rmsnorm", 1e-3, "ok", 3.0),
            ("rmsnorm", 1e-1, "plateau", 5.9),
            ("layernorm", 1e-3, "ok", 3.1),
            ("layernorm", 1e-1, "ok", 3.3),
        ):
            write_run(
                tmp_path / "s", f"{norm}-lr{lr}-s{seed}", norm, lr, seed, status, final + seed / 100
            )
    study = tmp_path / "study.yaml"
    study.write_text(
        f"name: s\nconfig: {CONFIGS / 'tiny.yaml'}\ngrid: "
        f"{{norm: [rmsnorm, layernorm], lr: [0.001, "
        "0.1]}\nprotocol: {selection_seeds: [0], test_seeds: [1, 2]}\n"
    )
    write_report([tmp_path / "s"], tmp_path / "out", draw=False)
    from_json = archived_runs(tmp_path / "out", study)
    (tmp_path / "out" / "runs.json.gz").unlink()
    from_md = archived_runs(tmp_path / "out", study)
    for runs in (from_json, from_md):
        by_name = {r.name: r for r in runs}
        assert len(runs) == 12 and by_name["layernorm-lr0.1-s2"].loss == pytest.approx(3.32)
        assert by_name["layernorm-lr0.1-s2"].config["model.norm"] == "layernorm"
        assert by_name["rmsnorm-lr0.1-s1"].lr == 0.1
    # no label is changed by hand: an archived `plateau` stays one, and the study's rule judges it
    # from what the table shows (its best eval, 5.9, never got 0.25 below the unigram entropy of the
    # study's data)
    from lab.read import judge
    from lab.studyfile import Rule

    stuck = [r for r in judge(from_md, Rule()) if r.name.startswith("rmsnorm-lr0.1")]
    assert {r.status for r in stuck} == {"plateau"} and all(
        r.why.startswith("did not learn") for r in stuck
    )


@pytest.mark.slow
def test_a_withdrawn_claim_is_reported_with_its_reason_and_a_malformed_one_is_refused(tmp_path):
    for seed in range(2):
        write_run(tmp_path, f"rms-{seed}", "rmsnorm", 1e-2, seed, "ok", 3.0)
        write_run(tmp_path, f"ln-{seed}", "layernorm", 1e-2, seed, "ok", 3.1)
    head = (
        f"name: w\nconfig: {CONFIGS / 'tiny.yaml'}\n"
        "grid: {norm: [rmsnorm, layernorm], lr: [0.01], seed: [0, 1]}\n"
    )
    (tmp_path / "study.yaml").write_text(
        head + "withdrawn:\n  - {paper: P 2020, says: S, why: needs 1000 layers}\n"
    )
    text = write_report([tmp_path], tmp_path / "out", draw=False).read_text()
    assert "- **P 2020**: S: **withdrawn**: needs 1000 layers" in text
    assert json.loads((tmp_path / "out" / "report.json").read_text())["withdrawn"] == [
        {"paper": "P 2020", "says": "S", "why": "needs 1000 layers"}
    ]
    (tmp_path / "study.yaml").write_text(head + "withdrawn:\n  - {paper: P, says: S}\n")
    with pytest.raises(ConfigError, match="withdrawn is a list of"):
        studyfile.load_study(tmp_path / "study.yaml")


@pytest.mark.slow
def test_a_best_lr_at_the_edge_of_the_grid_is_flagged(tmp_path):
    for seed in range(2):
        for lr, final in ((1e-3, 3.0), (1e-2, 3.2)):  # the lowest LR is the best: not bracketed
            write_run(tmp_path, f"rms-{lr}-{seed}", "rmsnorm", lr, seed, "ok", final)
    text = write_report([tmp_path], tmp_path / "out", draw=False).read_text()
    assert (
        "**all**: its best LR (0.001) is the lowest its selection seeds tried: not bracketed"
        in text
    )


def test_a_trend_along_a_numeric_axis_is_fitted_with_its_ci():
    """lab/trend.py's fit on constructed points: estimates exactly on a line in log2(x) give that
    slope; the CI is Knapp-Hartung's, sqrt(max(1, q) / sum w (x - xw)^2) x t(k - 2) (q = 0 on a
    line: t_1 = 12.7); points without a CI are left out; a point's se is its half-width over the
    quantile its CI was made with."""
    from scipy.stats import t as student

    from lab.trend import Z, fit

    se = 0.1
    ci = lambda e: (e - Z * se, e + Z * se)  # noqa: E731
    pts = [(64, 0.1, ci(0.1)), (128, 0.3, ci(0.3)), (256, 0.5, ci(0.5)), (512, 0.9, None)]
    slope, (lo, hi), used = fit(pts, log2=True)
    assert used == 3 and slope == pytest.approx(0.2)
    var = 1 / (sum((x - 7) ** 2 for x in (6, 7, 8)) / se**2)  # log2 64, 128, 256; mean 7
    assert (hi - lo) / 2 == pytest.approx(student.ppf(0.975, 1) * var**0.5)
    assert fit(pts[:2], log2=True)[1] is None  # two points: a slope, no CI
    # a t interval of 3 seeds (df 2) is wider than a z one of the same se: read back with t, the se
    # is the same
    t_pts = [
        (x, e, (e - student.ppf(0.975, 2) * se, e + student.ppf(0.975, 2) * se))
        for x, e, _ in pts[:3]
    ]
    assert fit(t_pts, log2=True, dfs=(2, 2, 2))[1] == pytest.approx((lo, hi))
    assert fit(pts[:1], log2=True)[0] is None  # one point: no slope
    # unequal weights: the line drawn passes through the weighted centre, not the plain mean of the
    # points
    from lab.trend import Trend, fitted

    uneven = [
        (64, 0.5, (0.5 - Z, 0.5 + Z)),
        (128, 0.0, (-Z * 0.01, Z * 0.01)),
        (256, 0.1, (0.1 - Z * 0.01, 0.1 + Z * 0.01)),
    ]
    t = Trend("loss difference", "a - b", "model.dim", True, uneven, *fit(uneven, log2=True))
    w = [1, 1e4, 1e4]  # 1 / se^2
    xw = sum(wi * x for wi, x in zip(w, (6, 7, 8), strict=True)) / sum(w)
    yw = sum(wi * e for wi, (_, e, _) in zip(w, uneven, strict=True)) / sum(w)
    assert fitted(t, 128) == pytest.approx(yw + t.slope * (7 - xw))
    # the precise points, not the mean
    assert abs(fitted(t, 128)) < 0.01 and abs(fitted(t, 256) - 0.1) < 0.01


def test_only_a_scale_is_a_trend_axis_not_an_on_off_field():
    """model.dim 32 / 64 / 96 is a scale (a slope per doubling means something); z-loss 0 / 1e-4 or
    warm-up 0 / 100 switch a thing on or off, and a boolean or a string is no axis at all."""
    from types import SimpleNamespace as NS

    from lab.trend import numeric_axes

    fields = {
        "model.dim": (32, 64, 96),
        "train.z_loss": (0.0, 1e-4, 1e-4),
        "optim.warmup_steps": (0, 100, 0),
        "model.qk_norm": ("none", "layernorm", "none"),
        "model.bias": (True, False, True),
        "model.norm_eps": (1e-6, 1e-5, 1e-5),
    }
    arms = {i: NS(runs=[NS(config={k: v[i] for k, v in fields.items()})]) for i in range(3)}
    assert numeric_axes(NS(keys=list(fields), arms=arms)) == ["model.dim", "model.norm_eps"]


def test_a_trend_whose_points_scatter_beyond_their_cis_gets_a_between_point_variance():
    """DerSimonian-Laird tau^2 for a meta-regression, against the matrix formula in numpy (an
    independent computation): points that agree with a line keep tau^2 = 0 (the fixed-effect fit);
    the DeepNorm study's loss differences (6, 12, 24 layers: one precise point off the others' line)
    get tau^2 > 0 and a slope CI that no longer excludes 0, where the fixed-effect one did (+0.081,
    +0.037..+0.125)."""
    import numpy as np
    from scipy.stats import t as student

    from lab.trend import Z, fit, tau2

    pts = [
        (6, -0.118, (-0.155, -0.080)),
        (12, -0.022, (-0.046, 0.003)),
        (24, -0.412, (-0.691, -0.133)),
    ]
    x = np.log2([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    v = np.array([((p[2][1] - p[2][0]) / (2 * Z)) ** 2 for p in pts])
    X, W = np.column_stack([np.ones(3), x]), np.diag(1 / v)
    beta = np.linalg.solve(X.T @ W @ X, X.T @ W @ y)
    q = float((y - X @ beta) @ W @ (y - X @ beta))
    expected = max(
        0.0, (q - 1) / (np.trace(W) - np.trace(np.linalg.solve(X.T @ W @ X, X.T @ W @ W @ X)))
    )
    assert tau2(pts, log2=True) == pytest.approx(expected) and expected > 0
    Ws = np.diag(1 / (v + expected))
    cov = np.linalg.inv(X.T @ Ws @ X)
    slope_re = float((cov @ X.T @ Ws @ y)[1])
    slope, (lo, hi), used = fit(pts, log2=True)
    resid = y - X @ (cov @ X.T @ Ws @ y)
    q = float(resid @ Ws @ resid)  # Knapp-Hartung's scale, k - 2 = 1 df
    assert slope == pytest.approx(slope_re)
    assert (hi - lo) / 2 == pytest.approx(student.ppf(0.975, 1) * (max(1.0, q) * cov[1, 1]) ** 0.5)
    assert lo < 0 < hi
    on_a_line = [(64, 0.1, (0.0, 0.2)), (128, 0.2, (0.1, 0.3)), (256, 0.3, (0.2, 0.4))]
    assert tau2(on_a_line, log2=True) == 0.0


@pytest.mark.slow
def test_a_width_study_reports_the_norm_comparison_by_width(tmp_path):
    """Arms norm x model.dim (constructed): LayerNorm's loss is RMSNorm's + 0.01 x log2(dim / 32)
    plus the same seed-to-seed noise at every width, so the loss difference rises 0.01 per doubling;
    the report's Trends section says so with its CI."""

    for dim in (32, 64, 128):
        for norm in ("rmsnorm", "layernorm"):
            for seed in range(4):
                extra = (
                    0.01 * math.log2(dim / 32) + 0.002 * ((seed * 7) % 3 - 1)
                    if norm == "layernorm"
                    else 0.0
                )
                write_run(
                    tmp_path,
                    f"{norm}-{dim}-{seed}",
                    norm,
                    1e-2,
                    seed,
                    "ok",
                    3.0 + seed / 10 + extra + 0.001 * (seed % 2),
                    overrides=(f"model.dim={dim}",),
                )
    text = write_report([tmp_path], tmp_path / "out").read_text()
    line = next(
        line
        for line in text.splitlines()
        if line.startswith("- loss difference layernorm - rmsnorm")
    )
    assert (
        "by model.dim" in line
        and "slope +0.010 per doubling of model.dim" in line
        and "32..128 only" in line
    )
    assert (
        "- LR50 ratio layernorm / rmsnorm, in log10 ratio, by model.dim: 32: -; 64: -; 128: - "
        # said, not dropped
        "('-': no estimate: "
        "an arm's LR50 is only bounded); no slope (0 of 3 points"
    ) in text
    assert (tmp_path / "out" / "trend.png").stat().st_size > 1000


def _curve_run(root, name, curve, l0=6.9, unigram=5.88, lr=1e-2, seed=0, norm="rmsnorm"):
    """A run whose val curve (steps 100, 200, ...) is `curve`, L0 at step 0."""
    write_run(root, name, norm, lr, seed, "ok", curve[-1], l0=l0)
    path = root / "runs" / name
    (path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "val/loss": v}) + "\n"
            for s, v in zip(range(0, 100 * len(curve) + 1, 100), [l0, *curve], strict=True)
        )
    )
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(
        json.dumps({**summary, "unigram_entropy": unigram, "best_val_loss": min(curve)})
    )


def test_a_run_in_flight_is_not_read_and_a_crashed_one_is_listed(tmp_path):
    """A run folder without a summary is read as crashed (status failed: listed as such, no
    training outcome) where the study's index lists it, and left out where it does not (in
    flight, or interrupted: the sweep reruns it); without an index every run folder is read."""
    for name, seed in (("done", 0), ("crashed", 1), ("in-flight", 2)):
        write_run(tmp_path, name, "rmsnorm", 1e-3, seed, "ok", 3.5)
    for name in ("crashed", "in-flight"):
        (tmp_path / "runs" / name / "summary.json").unlink()
    assert {r.name for r in study_runs.find_runs([tmp_path])} == {"done", "crashed", "in-flight"}
    index = {"study": "s", "runs": [{"name": "done"}, {"name": "crashed", "status": "crashed"}]}
    (tmp_path / "sweep.json").write_text(json.dumps(index))
    runs = {r.name: r for r in study_runs.find_runs([tmp_path])}
    assert set(runs) == {"done", "crashed"}
    assert runs["crashed"].status == "failed" and not runs["crashed"].finished
    assert runs["done"].finished and runs["done"].final == 3.5


@pytest.mark.parametrize(
    "curve,why",
    [
        ([5.0, 4.5, 4.2, 4.1], None),  # learned and kept it
        # still falling: failed at this budget
        ([6.5, 6.1, 5.9, 5.7], "did not learn: best 5.70 > unigram 5.88 - 0.25"),
        # a spike above L0 that recovered is still a failure
        ([5.0, 7.45, 4.5, 4.4], "blew up: 7.45 after 5.00"),
        ([4.5, 4.2, 4.6, 4.3], None),  # 0.4 above its best: within the 0.5 blow-up margin
        ([4.5, 4.2, 4.9, 4.3], "blew up: 4.90 after 4.20"),
    ],
)
def test_the_study_rule_judges_the_whole_curve_whatever_its_last_slope(tmp_path, curve, why):
    _curve_run(tmp_path, "r", curve)
    (run,) = study_runs.find_runs([tmp_path])
    assert (
        run.why == why
        and run.failed == (why is not None)
        and run.loss == (None if why else curve[-1])
    )


def test_an_eval_above_l0_fails_and_the_alternative_rules_judge_the_same_runs(tmp_path):
    from lab.studyfile import Rule

    # never 0.5 above its best before it... but > L0
    _curve_run(tmp_path, "above", [5.0, 6.95, 6.5, 6.4], l0=6.9)
    (run,) = study_runs.find_runs([tmp_path], Rule(blowup_margin=None))
    assert run.why == "rose above L0: 6.95 > 6.90"
    _curve_run(tmp_path, "good", [4.0, 3.8, 3.7, 3.6], seed=1)
    runs = study_runs.find_runs([tmp_path], Rule("gap", None, None, False, 1.0))
    assert {r.name: r.why for r in runs} == {
        "above": "final 6.40 > its arm's best 3.60 + 1",
        "good": None,
    }


def test_lr_sensitivity_is_wortsmans_mean_over_the_grid_by_hand(tmp_path):
    """Two arms, 3 seeds, grid 1e-3, 1e-2, 1e-1: L* is the lowest mean final loss of any arm at any
    LR; a failed run counts at its final loss capped at L0 (5.0); S per seed is the mean of min(L,
    L0) - L* over the grid."""
    from lab.arms import Arm
    from lab.sensitivity import sensitivities

    finals = {
        "rmsnorm": {
            1e-3: [3.5, 3.7, 3.6],
            1e-2: [3.0, 3.2, 3.1],
            1e-1: [None] * 3,
        },  # diverged: counts at L0
        "layernorm": {1e-3: [3.6, 3.8, 3.7], 1e-2: [3.1, 3.1, 3.1], 1e-1: [6.0, 5.5, 5.2]},
    }  # capped at L0
    for norm, by_lr in finals.items():
        for lr, vals in by_lr.items():
            for seed, v in enumerate(vals):
                write_run(
                    tmp_path,
                    f"{norm}-{lr}-{seed}",
                    norm,
                    lr,
                    seed,
                    "diverged" if v is None else "ok",
                    v,
                )
    keys, grouped = study_runs.group_arms(study_runs.find_runs([tmp_path]))
    sens = sensitivities({k: Arm(k, rs) for k, rs in grouped.items()}, (1e-3, 1e-2, 1e-1))
    l_star = 3.1  # rmsnorm at 1e-2: mean(3.0, 3.2) = 3.1 = layernorm's mean(3.1, 3.1)
    assert sens["rmsnorm"].l_star == pytest.approx(l_star)
    assert sens["rmsnorm"].per_seed == pytest.approx(
        {
            0: (3.5 + 3.0 + 5.0) / 3 - l_star,
            1: (3.7 + 3.2 + 5.0) / 3 - l_star,
            2: (3.6 + 3.1 + 5.0) / 3 - l_star,
        }
    )
    assert sens["layernorm"].per_seed == pytest.approx(
        {
            0: (3.6 + 3.1 + 5.0) / 3 - l_star,
            1: (3.8 + 3.1 + 5.0) / 3 - l_star,
            2: (3.7 + 3.1 + 5.0) / 3 - l_star,
        }
    )
    s = sens["rmsnorm"]
    assert s.mean == pytest.approx(sum(s.per_seed.values()) / 3) and s.ci[0] <= s.mean <= s.ci[1]
    # report.json's comparisons carry the paired difference the README's row reads
    from types import SimpleNamespace

    from lab.record import sensitivity_json

    res = SimpleNamespace(sensitivity=sens, file=SimpleNamespace(sensitivity_margin=0.05))
    d = sensitivity_json(res, "rmsnorm", "layernorm")
    assert d["n"] == 3 and d["mean"] == pytest.approx((-0.2 / 3 + 0 - 0.1 / 3) / 3)
    assert d["ci"][0] < d["mean"] < d["ci"][1] and sensitivity_json(res, "rmsnorm", "x") is None


@pytest.mark.slow
def test_lr_sensitivity_by_width_is_fitted_per_arm_with_its_ci_and_drawn(tmp_path):
    """Arms norm x model.dim (constructed, grid 1e-3, 1e-2, 1e-1, 3 seeds, L* = 3.0 at 1e-2 at every
    width): RMSNorm's LR sensitivity is 0.1 + 0.1 x log2(dim / 32) plus a seed offset that is the
    same at every width, LayerNorm's 0.1 at every width. The report fits each arm's sensitivity
    against log2(dim) (slope +0.1 and 0 per doubling, Knapp-Hartung CI from 3 points: t_1 x the se
    of the mean of 3 seeds over sqrt(sum (x - x_w)^2)), writes the lines into the report's text and
    json, and draws lr_sensitivity.png."""
    from scipy.stats import t as student

    for dim in (32, 64, 128):
        for norm in ("rmsnorm", "layernorm"):
            for seed in range(3):
                rise = 0.1 * math.log2(dim / 32) if norm == "rmsnorm" else 0.0
                s_seed = 0.1 + rise + 0.01 * (seed - 1)  # S = (a + 0 + b) / 3 with a = 0.15
                finals = {1e-3: 3.15, 1e-2: 3.0, 1e-1: 3.0 + 3 * s_seed - 0.15}
                for lr, final in finals.items():
                    write_run(
                        tmp_path,
                        f"{norm}-{dim}-{lr}-{seed}",
                        norm,
                        lr,
                        seed,
                        "ok",
                        final,
                        overrides=(f"model.dim={dim}",),
                    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lab.figures import sensitivity_by_axis
    from lab.record import as_json
    from lab.report import compute, render

    # the report's text and json, and only the figure under test (the rest is slow)
    res = compute([tmp_path])
    text = render(res, [])
    lines = {
        line.split(",")[0]: line
        for line in text.splitlines()
        if line.startswith("- LR sensitivity of")
    }
    rms, ln = lines["- LR sensitivity of norm=rmsnorm"], lines["- LR sensitivity of norm=layernorm"]
    assert (
        "by model.dim: 32: +0.100" in rms
        and "128: +0.300" in rms
        and "slope +0.100 per doubling" in rms
    )
    assert "slope +0.000 per doubling" in ln and "32..128 only" in ln
    sd_mean = 0.01 / math.sqrt(3)  # the seed offsets -0.01, 0, +0.01: their sd over sqrt(3)
    half = student.ppf(0.975, 1) * sd_mean / math.sqrt(2)  # sum (log2 dim - 6)^2 = 2
    trend = next(
        t
        for t in as_json(res)["trends"]
        if t["what"] == "LR sensitivity" and t["pair"] == "norm=rmsnorm"
    )
    assert trend["slope"] == pytest.approx(0.1) and trend["ci"] == pytest.approx(
        [0.1 - half, 0.1 + half]
    )
    made = []
    sensitivity_by_axis(plt, res, tmp_path, made)
    assert (
        made[0][0] == "lr_sensitivity.png" and (tmp_path / "lr_sensitivity.png").stat().st_size > 0
    )


@pytest.mark.slow
def test_an_lr_sensitivity_claim_is_decided_on_each_arms_own_best_and_says_if_per_size_l_changes_it(
    tmp_path,
):
    """Constructed (grid 1e-3, 1e-2, 1e-1, 3 seeds, one model size): RMSNorm reaches 3.0 at 1e-2 and
    3.3 around it; LayerNorm is flat near 3.6. With each arm's own L* (Wortsman et al.'s min over
    one algorithm's LRs, the primary) LayerNorm's S is ~0.07 and RMSNorm's 0.2: the claim 'LayerNorm
    is less sensitive' agrees; with L* the best of the size (3.0, the secondary view) LayerNorm's is
    ~0.57: it disagrees, and the report says the verdict depends on L*. The per-arm CI at 3 seeds is
    the t interval (n - 1 df), not a bootstrap."""
    from scipy.stats import t as student

    for seed in range(3):
        for norm, finals in (
            ("rmsnorm", (3.3, 3.0, 3.3 + 0.02 * seed)),
            ("layernorm", (3.6, 3.5, 3.6)),
        ):
            for lr, final in zip((1e-3, 1e-2, 1e-1), finals, strict=True):
                write_run(tmp_path, f"{norm}-{lr}-{seed}", norm, lr, seed, "ok", final)
    (tmp_path / "study.yaml").write_text(
        f"name: s\nconfig: {CONFIGS / 'tiny.yaml'}\ngrid: "
        f"{{norm: [rmsnorm, layernorm], lr: [0.001, 0.01, 0.1], "
        "seed: [0, 1, 2]}\nclaims:\n  - {paper: P, says: S, a: {norm: layernorm}, b: {norm: "
        "rmsnorm}, "
        "metric: lr_sensitivity, expect: lower}\n"
    )
    from lab.record import as_json
    from lab.report import compute, render

    res = compute([tmp_path])
    (claim,) = as_json(res)["claims"]
    assert claim["agreement"] == "agrees" and claim["estimate"] == pytest.approx(
        0.2 / 3 - (0.6 + 0.02) / 3
    )
    size = claim["size_l_star"]
    assert size["agreement"] == "disagrees" and size["estimate"] == pytest.approx(
        1.7 / 3 - (0.6 + 0.02) / 3
    )
    assert res.sensitivity["layernorm"].l_star == pytest.approx(3.5)
    assert res.sensitivity_size["layernorm"].l_star == pytest.approx(3.0)
    rms = res.sensitivity["rmsnorm"]
    values = list(rms.per_seed.values())
    half = student.ppf(0.975, 2) * statistics.stdev(values) / math.sqrt(3)
    assert rms.ci == pytest.approx(
        (statistics.fmean(values) - half, statistics.fmean(values) + half)
    )
    line = _sentence(render(res, []), "**P**: S")
    assert "With L* the best of any arm of the model size (secondary)" in line
    assert line.endswith("**the verdict depends on L***.")


def test_the_common_lr_is_the_largest_grid_lr_both_arms_fail_below_5_percent_at_the_upper_bound():
    """Constructed runs (no training): both arms fail above 0.03 on every one of 6 seeds, train
    below; the upper one-sided 95% bound of P(fail) falls below 5% two grid steps under the edge,
    and the common LR is the largest such grid LR; with runs that bound nothing (one seed), the
    fallback says so."""
    from dataclasses import dataclass as dc

    @dc
    class R:
        lr: float
        seed: int
        failed: bool
        finished: bool = True

        @property
        def trained(self):
            return not self.failed

    grid = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    arm = [R(lr, s, lr > 0.03) for lr in grid for s in range(6)]
    lr, how = protocol.common_lr(arm, arm, grid, [0, 1, 2])
    from lab.lr50 import p_fail_upper

    bounds = {x: p_fail_upper([r.lr for r in arm], [r.failed for r in arm], x) for x in grid}
    assert (
        lr == max(x for x in grid if bounds[x] < 0.05) and lr < 0.03 and "upper 95% bounds" in how
    )
    thin = [R(lr, 0, lr > 0.03) for lr in grid]
    lr, how = protocol.common_lr(thin, thin, grid, [0])
    assert lr == 0.03 and how.startswith("no grid LR has both P(fail) upper 95% bounds < 0.05")


@pytest.mark.slow
def test_every_claim_is_in_the_holm_family_whatever_its_data(tmp_path):
    """A claim no run can test (no arm matches it: the runs have no post-norm) still counts: the
    other claim's adjusted p is its raw p times the family's size."""
    claims = (
        CLAIM.format(extra=", placement: pre", expect="higher")
        + "  - {paper: Q, says: T, a: {norm: layernorm, placement: post}, "
        "b: {norm: rmsnorm, placement: post}, metric: common_loss, expect: same}\n"
    )
    results, text = _claims_study(tmp_path, claims, WORSE)
    tested, untested = results
    assert untested["p"] is None and untested["agreement"] == "not run"
    assert tested["p_holm"] == pytest.approx(min(1.0, 2 * tested["p"]))
    assert (
        "Holm-adjusted over the family of all 2" in text and "in the Holm family with p = 1" in text
    )


@pytest.mark.slow
def test_a_dyt_study_report_draws_the_saturation_of_a_trained_and_a_failed_run(tmp_path):
    """Runs that logged dyt/saturated/final and grad/absmax/trunk (one trained, one stuck at the
    unigram level with every trunk gradient 0): the report draws dyt_saturation.png; a study without
    them draws none."""
    for name, lr, final, sat, grad in (("ok", 1e-3, 3.0, 0.0, 0.3), ("dead", 1e-2, 5.9, 1.0, 0.0)):
        write_run(tmp_path / "s", name, "dyt", lr, 0, "ok", final)
        path = tmp_path / "s" / "runs" / name / "metrics.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records[1:]:
            r.update({"dyt/saturated/final": sat * r["step"] / 3, "grad/absmax/trunk": grad})
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    write_report([tmp_path / "s"], tmp_path / "out")
    assert (tmp_path / "out" / "dyt_saturation.png").stat().st_size > 1000
    write_report([tmp_path / "s"], tmp_path / "out")
    write_run(tmp_path / "plain", "r", "rmsnorm", 1e-3, 0, "ok", 3.0)
    write_report([tmp_path / "plain"], tmp_path / "out2")
    assert not (tmp_path / "out2" / "dyt_saturation.png").exists()


def test_the_report_states_the_budget_in_tokens_per_parameter():
    """The default study: 300 steps of 16 x 64 tokens on a 0.33M-parameter model whose blocks
    (Kaplan et al.'s non-embedding N) hold 0.2M: ~0.94 and ~1.6 tokens per parameter."""
    from lab.report import budget_text

    text = budget_text(STUDIES / "pilot-budget.yaml")
    for steps, per, per_block in ((300, "0.94", "1.6"), (1000, "3.1", "5.2"), (3000, "9.4", "16")):
        tokens = steps * 16 * 64
        assert f"{tokens / 1e6:.3g}M tokens ({steps} steps of 16 x 64) = {per} tokens per " in text
        assert f"{per_block} per non-embedding parameter (197,120-197,184)" in text


@pytest.mark.slow
def test_verdicts_by_budget_sit_side_by_side_and_say_whether_they_hold(tmp_path):
    """Arms that differ in train.steps: each claim's verdict per budget in one row, and whether it
    holds at every budget; here the norms tie at 20 steps and part at 40 (it changes)."""
    from lab.report import by_budget
    from lab.result import compute

    (tmp_path / "study.yaml").write_text(
        f"name: budgets\nconfig: {CONFIGS / 'tiny.yaml'}\n"
        "grid: {norm: [rmsnorm, layernorm], train.steps: [20, 40], lr: [0.01], "
        "seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}\nequivalence_margin: 0.05\n"
        "claims:\n  - {paper: p, says: RMSNorm matches LayerNorm, a: {norm: rmsnorm}, "
        "b: {norm: layernorm}, metric: best_loss, expect: same}\n"
    )
    for steps, gap in ((20, 0.0), (40, 0.5)):
        for seed in range(10):
            noise = {"rmsnorm": 0.002 * ((seed * 3) % 4), "layernorm": 0.003 * ((seed * 7) % 5)}
            for norm, final in (("rmsnorm", 3.0 + gap), ("layernorm", 3.0)):
                write_run(
                    tmp_path,
                    f"{norm}-{steps}-{seed}",
                    norm,
                    0.01,
                    seed,
                    "ok",
                    final + noise[norm],
                    overrides=(f"train.steps={steps}",),
                )
    table = "\n".join(by_budget(compute([tmp_path])))
    assert "| claim | A vs B | 20 steps | 40 steps | at every budget |" in table
    row = next(line for line in table.splitlines() if line.startswith("| RMSNorm matches"))
    assert "rmsnorm vs layernorm" in row and "changes with the budget" in row
    assert row.index("**agrees**") < row.index("**disagrees**")


BUDGETS_STUDY = (
    "name: budgets\nconfig: {tiny}\n"
    "grid: {{norm: [rmsnorm, layernorm], train.steps: [20, 40], lr: [0.01]}}\n"
    "protocol: {{selection_seeds: [0, 1, 2, 3, 4], test_seeds: [5, 6, 7, 8, 9], refine: 0, "
    "bracket: {{steps: 0}}}}\nequivalence_margin: 0.05\n"
    "claims:\n  - {{paper: p, says: RMSNorm matches LayerNorm, a: {{norm: rmsnorm}}, "
    "b: {{norm: layernorm}}, metric: best_loss, expect: same}}\n"
)


def _fake_run(root, spec):
    """A finished run for a spec of BUDGETS_STUDY (no training): the norms' losses differ by a
    little seed noise."""
    v = dict(o.split("=", 1) for o in spec["overrides"])
    seed, norm = int(v["train.seed"]), v["model.norm"]
    noise = {"rmsnorm": 0.002 * ((seed * 3) % 4), "layernorm": 0.003 * ((seed * 7) % 5)}
    write_run(
        root,
        spec["name"],
        norm,
        0.01,
        seed,
        "ok",
        3.0 + noise[norm],
        overrides=(f"train.steps={v['train.steps']}",),
    )


@pytest.mark.slow
def test_a_sweep_runs_budget_by_budget_and_records_what_is_still_running(tmp_path, monkeypatch):
    """The sweep's stages along a budget axis (run_study faked: it writes each run's directory):
    20 steps' grid and test stage, then 40's; sweep.json's `running` says at each stage which
    budgets are not finished, and {} when the sweep has finished; --up-to stops between them."""
    (tmp_path / "s.yaml").write_text(BUDGETS_STUDY.format(tiny=CONFIGS / "tiny.yaml"))
    seen = []

    def fake(study, runs, study_dir, workers=None, process_per_run=False, running=None):
        for spec in runs:
            if not (study_dir / "runs" / spec["name"]).exists():
                _fake_run(study_dir, spec)
        seen.append(dict(running))
        runner._write_index(study_dir / "sweep.json", study, runs, {}, running)
        return {"ok": 1}

    monkeypatch.setattr(sweep_cli, "run_study", fake)
    argv = [str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"), "--no-report"]
    assert sweep([*argv, "--up-to", "20"]) == 0  # the short budget alone...
    assert seen == [{20: "grid", 40: "grid"}, {20: "test", 40: "grid"}]
    index = json.loads((tmp_path / "out" / "budgets" / "sweep.json").read_text())
    assert index["running"] == {"40": "grid"}
    assert sweep(argv) == 0  # ...then the rest
    assert seen[2:] == [{40: "grid"}, {40: "test"}]
    index = json.loads((tmp_path / "out" / "budgets" / "sweep.json").read_text())
    assert (
        index["running"] == {}
        and len(list((tmp_path / "out" / "budgets" / "runs").iterdir())) == 40
    )


@pytest.mark.slow
def test_a_study_stopped_between_its_budgets_reports_the_unfinished_one_as_running(tmp_path):
    """The 20-step budget's stages all ran, the 40-step one's test stage did not (sweep.json says
    so): its claim is `running` (in the Holm family with p = 1), the report says it is interim and
    where, the table by budget does not say whether the verdict holds, and the README reads the
    20-step runs."""
    from lab.readme import at_longest
    from lab.record import as_json
    from lab.report import by_budget
    from lab.result import compute

    (tmp_path / "study.yaml").write_text(BUDGETS_STUDY.format(tiny=CONFIGS / "tiny.yaml"))
    study = studyfile.load_study(tmp_path / "study.yaml")
    for arm in protocol.arms_of(study):
        seeds = range(10) if arm["train.steps"] == 20 else range(5)  # 40 steps: the grid alone
        for spec in protocol.specs(study, arm, [0.01], seeds):
            _fake_run(tmp_path, spec)
    runner._write_index(tmp_path / "sweep.json", study, [], {}, {40: "test"})
    res = compute([tmp_path])
    assert res.running == {40: "test"}
    at = {c.a.split("/")[-1]: c for c in res.claims}
    assert at["steps=40"].agreement == "running" and at["steps=40"].p is None
    assert at["steps=20"].agreement == "agrees"
    row = next(x for x in by_budget(res) if x.startswith("| RMSNorm matches"))
    assert "| running |" in row and "not known yet" in row and "holds" not in row
    report = as_json(res)
    assert report["running"] == {"40": "test"}
    (tmp_path / "out").mkdir()
    text = write_report([tmp_path], tmp_path / "out", draw=False).read_text()
    assert "**Interim report**" in text and "at 40 steps, from the test stage on" in text
    report["budgets"] = [{"steps": 20}, {"steps": 40}]
    assert [c["A"] for c in at_longest(report)["claims"]] == ["rmsnorm"]
    assert at_longest(report)["claims"][0]["agreement"] == "agrees"  # read at 20 steps
    assert at_longest(report)["read_at"] == 20


@pytest.mark.slow
def test_the_2025_studies_are_designed_as_their_files_say():
    """norms-2025: six arms a budget at 12 layers (the placements without the embedding scalar,
    RMSNorm and Derf with it), every claim against pre-norm RMSNorm with the same scalar, at both
    budgets; controls-2025: seven arms a budget, each changing at most one control."""
    norms = studyfile.load_study(STUDIES / "norms-2025.yaml")
    arms = protocol.arms_of(norms)
    assert len(arms) == 12 and {a["train.steps"] for a in arms} == {300, 1000}
    for c in norms.claims:
        pairs = protocol.arm_pairs(norms, c)
        assert len(pairs) == 2 and {a["train.steps"] for a, _ in pairs} == {300, 1000}
        for a, b in pairs:
            assert (
                b["model.placement"] == "pre" and a["model.embed_scale"] == b["model.embed_scale"]
            )
    cfg = load_config(norms.config, protocol.first_runs(norms)[0]["overrides"])
    assert cfg.model.n_layers == 12 and cfg.model.init_scale == "width" and cfg.model.dim == 32
    controls = studyfile.load_study(STUDIES / "controls-2025.yaml")
    default = {
        "model.qk_norm": "none",
        "model.attn_gate": "none",
        "optim.update_clip": False,
        "optim.skip_step_sigma": 0.0,
        "optim.qk_clip_tau": 0.0,
    }
    arms = protocol.arms_of(controls)
    assert len(arms) == 14
    assert all(sum(a[k] != v for k, v in default.items()) <= 1 for a in arms)
    assert sum(len(protocol.arm_pairs(controls, c)) for c in controls.claims) == 14


@pytest.mark.slow  # expands and validates every run of seven study files
def test_the_2025_claims_are_asked_in_their_papers_configurations():
    """Issue 61: each paper's arms, recipe and claim pairs as its file states them, at one 1000-step
    budget with a warmup of 10% of it (update-clip: the default recipe at beta2 0.95 and 0.99)."""
    want = {
        "hybridnorm": (4, 0.1118, "scaled", 0.95, 0.1, 1.0, {"post", "pre"}),
        "derf-parity": (3, 0.098, "scaled", 0.95, 0.1, 1.0, {"layernorm", "dyt"}),
        "lns-mixln": (3, 0.098, "plain", 0.98, 0.0, 0.0, {"pre"}),
    }
    for name, (n, std, residual, beta2, wd, clip, against) in want.items():
        study = studyfile.load_study(STUDIES / f"{name}.yaml")
        arms = protocol.arms_of(study)
        assert len(arms) == n, name
        cfg = load_config(study.config, protocol.first_runs(study)[0]["overrides"])
        assert cfg.train.steps == 1000 and cfg.optim.warmup_steps == 100, name
        assert (cfg.model.n_layers, cfg.model.init_scale, cfg.model.init_std) == (
            12,
            "absolute",
            std,
        )
        assert (cfg.model.init_residual, cfg.optim.beta2) == (residual, beta2), name
        assert (cfg.optim.weight_decay, cfg.optim.grad_clip) == (wd, clip), name
        seen = set()
        for c in study.claims:
            ((a, b),) = protocol.arm_pairs(study, c)
            seen.add(b["model.norm"] if name == "derf-parity" else b["model.placement"])
        assert against <= seen, name
    lns = studyfile.load_study(STUDIES / "lns-mixln.yaml")
    assert {c["metric"] for c in lns.claims} == {"common_loss"}  # one shared LR, as its scripts
    clip = studyfile.load_study(STUDIES / "update-clip.yaml")
    assert {(a["optim.update_clip"], a["optim.beta2"]) for a in protocol.arms_of(clip)} == {
        (u, b) for u in (False, True) for b in (0.95, 0.99)
    }
    assert clip.withdrawn and "skip-step" in clip.withdrawn[0]["says"]


def test_a_runs_spike_scores_are_read_from_its_records_by_todays_detector(tmp_path):
    """A summary's spike scores were computed when the run ended, by the detector of the day; a
    study reads them again from the run's records (as it judges its failure again), so a report
    never mixes detectors. A run without records keeps what its summary says."""
    from normlab.spikes import spike_score

    write_run(tmp_path, "r", "rmsnorm", 1e-3, 0, "ok", 3.5)
    path = tmp_path / "runs" / "r"
    loss = [7.748, 7.506, 7.199, 6.78, 6.631, 6.264, 6.166, 5.987] + [6.0] * 40
    loss[30] = 9.0
    (path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s + 1, "train/loss": v, "grad/norm": 1.0}) + "\n"
            for s, v in enumerate(loss)
        )
    )
    (run,) = study_runs.find_runs([tmp_path])
    assert run.summary["spike_score/loss"] == pytest.approx(spike_score(loss, 5, 5))
    assert run.summary["spike_score/loss"] == pytest.approx(100 / 41)  # the one at step 31
    assert run.summary["spike_score/grad_norm"] == 0.0
    (path / "metrics.jsonl").write_text("")
    (run,) = study_runs.find_runs([tmp_path])
    assert run.summary["spike_score/loss"] == 1.0  # the summary's own (conftest's) value


def test_a_truncated_sweep_json_is_one_line_naming_it(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(f"name: s\nconfig: {CONFIGS / 'tiny.yaml'}\ngrid: {{lr: [0.01]}}\n")
    (tmp_path / "out" / "s").mkdir(parents=True)
    (tmp_path / "out" / "s" / "sweep.json").write_text('{"study": {"name": "s"}, "runs": [{"na')
    assert sweep([str(study), "--out", str(tmp_path / "out"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: {tmp_path / 'out' / 's' / 'sweep.json'} is "
    )
    assert "not valid JSON (line 1: Unterminated string" in err[0]


def test_a_run_in_flight_in_a_plain_runs_folder_is_not_read_as_crashed(tmp_path, capsys):
    """A run directory without a summary whose lock a process holds is training: left out, not
    counted as a failed (crashed) run."""
    from filelock import FileLock

    from lab.read import find_runs
    from training.rundir import RunDir

    for seed in (0, 1):
        write_run(tmp_path, f"done-{seed}", "rmsnorm", 1e-2, seed, "ok", 3.0)
    write_run(tmp_path, "live", "rmsnorm", 1e-2, 2, "ok", 3.0)
    (tmp_path / "runs" / "live" / "summary.json").unlink()
    write_run(tmp_path, "dead", "rmsnorm", 1e-2, 3, "ok", 3.0)
    (tmp_path / "runs" / "dead" / "summary.json").unlink()
    lock = FileLock(str(RunDir(tmp_path / "runs" / "live").lock))
    with lock:
        names = {r.name: r.status for r in find_runs([tmp_path / "runs"])}
    assert "live" not in names and names["dead"] == "failed" and names["done-0"] == "ok"
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"note: {tmp_path / 'runs' / 'live'} is still running: left out until it ends"]
