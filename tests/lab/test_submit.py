"""Studies past one machine on submitit (lab/submit.py): the quick study through submitit's local
executor computes what the worker pool does; a preempted run is requeued and resumes bit for bit;
the SLURM executor's submission, read from the files submitit writes (no cluster)."""

import json
import os
import re
import stat
from pathlib import Path

import pytest
import submitit
import yaml
from conftest import TINY

import train
from lab.runner import run_argv
from lab.studyfile import Study
from lab.submit import RunTask, executor
from lab.sweep import sweep
from training.rundir import read_metrics

STUDIES = train.REPO / "lab" / "studies"


def finals(study_dir: Path) -> dict:
    return {
        p.parent.name: json.loads(p.read_text())["final_val_loss"]
        for p in sorted((study_dir / "runs").glob("*/summary.json"))
    }


@pytest.mark.slow
def test_a_study_through_the_local_executor_is_the_pools(tmp_path, capsys):
    """The quick study's design cut to both norms at one placement, LR and seed and 40 steps: the
    same runs through submitit's local executor and through the worker pool give the same finals
    and report; a rerun submits nothing."""
    study = yaml.safe_load((STUDIES / "quick.yaml").read_text())
    study["overrides"]["train"] |= {"steps": 40, "eval_every": 20}
    study["grid"] |= {"placement": ["pre"], "lr": [3.0e-3]}
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump(study))
    assert sweep([str(path), "--out", str(tmp_path / "pool")]) == 0
    assert sweep([str(path), "--out", str(tmp_path / "local"), "--executor", "local"]) == 0
    assert "2 submitted as one job array" in capsys.readouterr().out
    pool, local = tmp_path / "pool" / "quick", tmp_path / "local" / "quick"
    assert finals(pool) == finals(local) and len(finals(local)) == 2
    a, b = (json.loads((d / "report.json").read_text()) for d in (pool, local))
    for key in ("runs", "arms", "per_arm", "claims", "comparisons"):
        assert a[key] == b[key], key
    assert list((local / "submitit").glob("*_submitted.pkl"))  # submitit's own files
    # a rerun passes over the finished runs: nothing submitted again
    assert sweep([str(path), "--out", str(tmp_path / "local"), "--executor", "local"]) == 0
    assert "2 already finished, 0 submitted" in capsys.readouterr().out


@pytest.mark.slow
def test_a_preempted_run_is_requeued_and_resumes_bit_for_bit(tmp_path, data_args, monkeypatch):
    """The preemption notice (SIGUSR2, what SLURM sends through submitit) at step 35 of a run under
    submitit's local executor: the task checkpoints, is requeued, the run resumes from its step-20
    checkpoint, and its metrics are an uninterrupted run's."""
    run = {"name": "r", "overrides": [*data_args, "train.steps=50", "train.checkpoint_every=10",
                                      "train.eval_every=25", "train.sample_tokens=0"]}  # fmt: skip
    study = Study(name="s", config=TINY, dir=str(tmp_path), grid={})

    def task(folder: Path) -> RunTask:
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        return RunTask(run_argv(run, study, folder, 1), str(folder / "logs" / "r.log"), 1)

    once = tmp_path / "once"
    assert task(once)() == 0  # uninterrupted, in this process
    monkeypatch.setenv("NORMLAB_KILL_AT", "step:35:usr2")
    monkeypatch.setenv("NORMLAB_FAULT_ONCE", str(tmp_path / "fired"))
    ex = submitit.LocalExecutor(tmp_path / "submitit", max_num_timeout=3)
    ex.update_parameters(timeout_min=10)
    folder = tmp_path / "preempted"
    assert ex.submit(task(folder)).result() == 0
    assert (tmp_path / "fired").exists()
    log = (folder / "logs" / "r.log").read_text()
    assert log.count("$ train.py") == 2 and "resumed at step 30" in log, log[-3000:]
    drop = ("train/tokens_per_s",)  # wall time, not the computation
    a = read_metrics(once / "runs" / "r" / "metrics.jsonl")
    b = read_metrics(folder / "runs" / "r" / "metrics.jsonl")
    assert len(a) == 51 and [{k: v for k, v in r.items() if k not in drop} for r in a] == [
        {k: v for k, v in r.items() if k not in drop} for r in b
    ]


def test_the_slurm_executor_submits_one_array_per_stage(tmp_path, monkeypatch):
    """With a stand-in sbatch on the PATH: one job array for a stage's runs, its sbatch file
    asks for the partition, time, CPUs and GPUs per run and the array's size and parallelism,
    and runs submitit's entry point on the pickled tasks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\necho "Submitted batch job 4242"\n'
    )
    (bin_dir / "srun").write_text("#!/bin/sh\n")  # submitit looks for SLURM's srun first
    for tool in (sbatch, bin_dir / "srun"):
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    study = Study(name="two-stage", config=TINY, dir=str(tmp_path), grid={}, threads_per_worker=2)
    options = {"partition": "gpu", "time_min": 30, "gpus_per_run": 1, "array_parallelism": 4}
    ex = executor("slurm", tmp_path / "submitit", study, options)
    runs = [{"name": f"run{i}", "overrides": [f"optim.lr={0.001 * (i + 1)}"]} for i in range(6)]
    tasks = [RunTask(run_argv(r, study, tmp_path, 2), str(tmp_path / f"{r['name']}.log"), 2)
             for r in runs]  # fmt: skip
    jobs = ex.submit_array(tasks)
    assert [j.job_id for j in jobs] == [f"4242_{i}" for i in range(6)]
    (call,) = (tmp_path / "calls").read_text().splitlines()
    text = Path(call.split()[-1]).read_text()
    for line in ("#SBATCH --array=0-5%4", "#SBATCH --partition=gpu", "#SBATCH --time=30",
                 "#SBATCH --cpus-per-task=2", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --job-name=two-stage"):  # fmt: skip
        assert line in text, text
    assert re.search(r"-m submitit\.core\._submit", text) and f"PYTHONPATH={train.REPO}" in text
