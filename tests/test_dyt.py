"""DyT on the DyT study's model (lab/studies/dyt.yaml) and the embedded corpus: with the paper's
init scales transposed to d = 64 it trains; with the recipe's absolute std 0.02 it reaches the
dead-gradient state (issue 35). A constructed model with a dead trunk shows how train.py reports
that state."""

import json
import os
import subprocess
import sys

import pytest
from conftest import THREADS

import train
from lab.studyfile import flatten, load_study
from training.outcome import EXIT_OK
from training.rundir import read_metrics

STUDY = train.REPO / "lab" / "studies" / "dyt.yaml"


def _stats(run_dir, step: int) -> dict:
    return next(r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] == step)


@pytest.mark.slow
def test_dyt_at_the_papers_scale_trains_and_at_its_absolute_constants_its_gradients_die(
    tmp_path, capsys, pydocs_1024
):
    """The DyT study's model (d = 64, 4 layers, alpha0 0.8 / 0.2 / 0.2, no bias, the sqrt(d) scalar,
    vocab 1024, 16 x 64 tokens a step) at lr 3e-3 on the study's 300-step schedule, seed 0. Measured
    (lab/analyses/dyt_saturation.py): absolute 0.02 init: the stream's RMS 0.16 -> 35 by step 30 ->
    143 by step 50, every unit of the final DyT saturated from step ~40 and every gradient below the
    final norm exactly 0 from then on, val 5.94-5.96 (unigram 5.81); width init (std 0.16): no unit
    saturated, val 5.74 at step 50 and 5.15 at step 100 (the line the study's failure rule draws is
    5.81 - 0.25 = 5.56). Far from either edge: ~40 s on one thread."""
    study = load_study(STUDY)
    common = [
        "--config",
        study.config,
        f"log.out_dir={tmp_path}",
        f"data.root={pydocs_1024.parent}",
        *flatten(study.overrides),
        "model.norm=dyt",
        "model.embed_scale=sqrt_dim",
        "optim.lr=3e-3",
        "train.seed=0",
        "optim.schedule_steps=300",
        "log.stats_every=10",
        f"train.threads={THREADS or 1}",
    ]
    assert (
        train.main(
            [
                *common,
                "--name",
                "absolute",
                "model.init_scale=absolute",
                "train.steps=60",
                "train.eval_every=30",
            ]
        )
        == EXIT_OK
    )
    assert (
        "collapsed: dead gradients (every gradient below the final norm 0 from step"
        in capsys.readouterr().out
    )
    summary = json.loads((tmp_path / "absolute" / "summary.json").read_text())
    assert summary["status"] == "collapsed" and summary["dead_gradients_at"] <= 50
    at50 = _stats(tmp_path / "absolute", 50)
    assert at50["grad/absmax/trunk"] == 0.0 and at50["grad/norm/head"] > 0
    assert at50["dyt/saturated/final"] == 1.0 and at50["act/rms/layer_3"] > 30
    # the unigram level, never below it
    assert summary["best_val_loss"] > summary["unigram_entropy"]

    assert (
        train.main(
            [
                *common,
                "--name",
                "width",
                "model.init_scale=width",
                "train.steps=100",
                "train.eval_every=50",
            ]
        )
        == EXIT_OK
    )
    summary = json.loads((tmp_path / "width" / "summary.json").read_text())
    at50 = _stats(tmp_path / "width", 50)
    assert (
        at50["grad/absmax/trunk"] > 1e-3
        and at50["dyt/saturated/final"] < 0.01
        and at50["act/rms/layer_3"] < 20
    )
    assert summary["dead_gradients_at"] is None and summary["status"] == "ok"
    assert summary["final_val_loss"] < summary["unigram_entropy"] - 0.25


def test_a_dead_trunk_is_reported_as_collapsed_with_its_reason(tmp_path, capsys, run_tiny):
    """A constructed dead trunk: a final DyT with alpha0 1e9 on a stream shifted to +1 (the
    embedding's mean) has every unit saturated at +1 for every token, so no gradient passes it from
    step 1 on while the head learns the unigram distribution of a constant feature. summary.json
    says when, the status is collapsed (it was falling toward the unigram level: a plateau by its
    slope alone), the last line says why."""
    assert (
        run_tiny(
            "--name",
            "dead",
            "model.norm=dyt",
            "model.norm_options.dyt.alpha_final=1e9",
            "model.init_embedding_mean=1.0",
            "optim.lr=1e-2",
            "train.sample_tokens=0",
        )
        == EXIT_OK
    )
    summary = json.loads((tmp_path / "dead" / "summary.json").read_text())
    assert summary["status"] == "collapsed" and summary["dead_gradients_at"] == 1
    records = [
        r for r in read_metrics(tmp_path / "dead" / "metrics.jsonl") if "grad/absmax/trunk" in r
    ]
    assert [r["step"] for r in records] == [1, 5, 10, 15, 20] and all(
        r["grad/absmax/trunk"] == 0.0 for r in records
    )
    assert all(r["dyt/saturated/final"] == 1.0 and r["grad/norm/head"] > 0 for r in records)
    out = capsys.readouterr().out
    assert (
        "collapsed: dead gradients (every gradient below the final norm 0 from step 1); final val "
        "loss" in out
    )
    # DyT's default alpha0 0.5 on the unshifted embedding: gradients flow throughout, nothing is
    # said (with the +1 shift and alpha0 0.5 the stream grows until every final unit saturates: dead
    # from step 15 of 20)
    alive = ["--name", "alive", "model.norm=dyt", "optim.lr=1e-2", "train.sample_tokens=0"]
    assert run_tiny(*alive) == EXIT_OK
    assert (
        json.loads((tmp_path / "alive" / "summary.json").read_text())["dead_gradients_at"] is None
    )
    assert "dead gradients" not in capsys.readouterr().out


@pytest.mark.slow
def test_the_saturation_script_prints_its_table(pydocs_1024):
    """lab/analyses/dyt_saturation.py, two measured steps of each init: a row per init and step, the
    absolute init's stream at the recipe's scale (0.16 at step 0) and the width init's at the
    paper's (1.3)."""
    r = subprocess.run(
        [
            sys.executable,
            "lab/analyses/dyt_saturation.py",
            "--at",
            "0",
            "2",
            "--data-root",
            str(pydocs_1024.parent),
        ],
        cwd=train.REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(train.REPO)},
    )  # this checkout's packages
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [
        line.split(" | ")
        for line in r.stdout.splitlines()
        if line.startswith(("| absolute", "| width"))
    ]
    assert [(row[0], row[2]) for row in rows] == [
        ("| absolute", "0"),
        ("| absolute", "2"),
        ("| width", "0"),
        ("| width", "2"),
    ]
    assert float(rows[0][3]) == pytest.approx(0.16, rel=0.05) and float(
        rows[2][3]
    ) == pytest.approx(1.3, rel=0.05)
