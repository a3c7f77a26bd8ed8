"""train.py end to end on the tiny config: run directory, resume, divergence, interrupts, torchrun,
wandb."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import TINY, logged
from conftest import logged as losses

import train
from model.blocks import BLOCKS
from model.norm_config import NORMS
from training.checkpoint import load_checkpoint, save_checkpoint
from training.outcome import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK
from training.rundir import read_metrics


@pytest.mark.slow
def test_tiny_run_writes_the_design_files_and_learns(tmp_path, capsys, run_tiny):
    assert run_tiny("--name", "a", "train.steps=40", "optim.lr=1e-2") == EXIT_OK
    run_dir = tmp_path / "a"
    assert {p.name for p in run_dir.iterdir()} >= {
        "config.yaml",
        "meta.json",
        "metrics.jsonl",
        "summary.json",
        "checkpoints",
    }
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(0, 41))
    per_layer = [
        "grad/norm/layer_{i}",
        "param/norm/layer_{i}",
        "update/ratio/layer_{i}",
        "act/rms/layer_{i}",
        "norm_in/mean/layer_{i}",
        "norm_in/rms/layer_{i}",
        "norm_in/absmax/layer_{i}",
        "norm_in/mean_energy/layer_{i}",
        "norm_in/mean_energy/layer_{i}/attention_norm",
        "norm_in/mean_energy/layer_{i}/ffn_norm",
        "norm/gain/layer_{i}",
        "attn/logit_max/layer_{i}",
        "attn/entropy/layer_{i}",
    ]
    design = {
        "step",
        "train/loss",
        "train/lr",
        "train/tokens_per_s",
        "val/loss",
        "val/loss_se",
        "val/bpb",
        "grad/norm",
        "grad/clipped",
        "grad/absmax/trunk",
        "grad/norm/embed",
        "grad/norm/head",
        "logits/max",
        "logits/log_z",
        "optim/rms_t/tok_embeddings",
        "optim/rms_t/output",
        "optim/rms_t/norm",
        "norm_in/mean_energy/final",
    }
    per_layer += ["optim/rms_t/layer_{i}"]
    per_layer += [
        f"update/ratio/layer_{{i}}/{m}"
        for m in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "attention.wo",
            "feed_forward.w1",
            "feed_forward.w2",
            "feed_forward.w3",
            "gains",
        )
    ]
    design |= {name.format(i=i) for name in per_layer for i in range(2)}
    assert set().union(*records) == design  # exactly the glossary's names (docs/usage.md)
    stats_steps = [r["step"] for r in records if "act/rms/layer_0" in r]
    assert stats_steps == [1, 5, 10, 15, 20, 25, 30, 35, 40]  # log.stats_every=5 in tiny.yaml
    loss = losses(run_dir)
    assert loss[0] > 5.5 and loss[-1] < loss[0] - 1.5  # ln(320) = 5.77 at init
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] in ("ok", "plateau") and summary["steps"] == 40
    assert summary["final_val_loss"] == losses(run_dir, "val/loss")[-1]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["parameters"] > 0 and meta["torch"] == torch.__version__ and "commit" in meta["git"]
    # it changes results (1e-39 -> 0), so the run says so
    assert meta["cpu"]["flush_denormal"] is True
    # the default implementation
    assert meta["kernels"]["norm"] == meta["kernels"]["swiglu"] == "reference"
    assert "model:" in (run_dir / "config.yaml").read_text()
    # and scripts/sample.py generates from its checkpoint, the same text for the same seed
    argv = [sys.executable, "-m", "scripts.sample", str(run_dir), "--tokens", "12", "--seed", "3"]
    first, second = (
        subprocess.run(argv, cwd=train.REPO, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    )
    assert (
        first.returncode == 0 and first.stdout == second.stdout and first.stdout.startswith("The ")
    )


@pytest.mark.slow
def test_metrics_do_not_change_training(tmp_path, run_tiny):
    assert run_tiny("--name", "every", "train.steps=8", "log.stats_every=1") == 0
    assert run_tiny("--name", "never", "train.steps=8", "log.stats_every=0") == 0
    assert losses(tmp_path / "every") == losses(tmp_path / "never")
    assert losses(tmp_path / "every", "grad/norm") == losses(tmp_path / "never", "grad/norm")


@pytest.mark.slow
# float16: the GradScaler's state is resumed too
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_resume_is_exact(tmp_path, dtype, run_tiny):
    assert (
        run_tiny("--name", "full", "train.steps=16", "train.eval_every=4", f"train.dtype={dtype}")
        == 0
    )
    assert (
        run_tiny(
            "--name",
            "half",
            "train.steps=16",
            "train.eval_every=4",
            "train.stop_at=8",
            "train.checkpoint_every=100",
            f"train.dtype={dtype}",
        )
        == 0
    )
    part = json.loads((tmp_path / "half" / "summary.json").read_text())
    assert part["status"] == "interrupted" and part["steps"] == 8
    assert train.main(["--name", "half", "--resume", f"log.out_dir={tmp_path}"]) == 0
    assert losses(tmp_path / "half") == losses(tmp_path / "full")  # bitwise equal, all 16 steps
    assert losses(tmp_path / "half", "val/loss") == losses(tmp_path / "full", "val/loss")
    assert json.loads((tmp_path / "half" / "summary.json").read_text())["steps"] == 16
    # the loss scale was live and its state (scale, steps since growth) is checkpointed
    if dtype == "float16":
        scales = losses(tmp_path / "half", "amp/scale")
        assert len(scales) == 16 and scales == losses(tmp_path / "full", "amp/scale")
        scaler = load_checkpoint(tmp_path / "half" / "checkpoints" / "latest.pt")["scaler"]
        # counted on across the resume
        assert scaler["scale"] == scales[-1] and scaler["_growth_tracker"] == 16


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "latest.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})

    def torn_save(obj, f):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(OSError):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["latest.pt"]  # no temp file left behind


@pytest.mark.slow
def test_absurd_learning_rate_diverges_cleanly(tmp_path, run_tiny):
    code = run_tiny(
        "--name",
        "boom",
        "optim.lr=1e4",
        "optim.grad_clip=0",
        "optim.warmup_steps=0",
        "train.steps=30",
    )
    assert code == EXIT_DIVERGED == 3
    summary = json.loads((tmp_path / "boom" / "summary.json").read_text())
    assert summary["status"] == "diverged" and 1 < summary["diverged_at"] <= 30
    records = read_metrics(tmp_path / "boom" / "metrics.jsonl")
    last = records[-1]
    assert last["step"] == summary["diverged_at"] and None in (
        last["train/loss"],
        last["grad/norm"],
    )  # NaN -> null
    # 0: L0
    assert all(r["train/loss"] is not None and r["grad/norm"] is not None for r in records[1:-1])


@pytest.mark.slow
def test_ctrl_c_saves_and_resumes(tmp_path, data_args):
    cmd = [
        sys.executable,
        "train.py",
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "--name",
        "c",
        "train.steps=100000",
        "train.checkpoint_every=0",
        "train.eval_every=100000",
    ]
    proc = subprocess.Popen(
        cmd, cwd=train.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    metrics = tmp_path / "c" / "metrics.jsonl"
    deadline = time.time() + 120
    while len(read_metrics(metrics)) < 5 and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    state = load_checkpoint(tmp_path / "c" / "checkpoints" / "latest.pt")
    assert summary["status"] == "interrupted" and state["step"] == summary["steps"] >= 5
    assert (
        train.main(
            [
                "--name",
                "c",
                "--resume",
                f"log.out_dir={tmp_path}",
                f"train.steps={state['step'] + 3}",
            ]
        )
        == 0
    )
    assert [r["step"] for r in read_metrics(metrics)] == list(range(0, state["step"] + 4))


@pytest.mark.slow
@pytest.mark.parametrize(
    "controls",
    [
        [],
        # QK-Clip reads each rank's max logit: every rank must rescale by the largest (one model)
        ["optim.qk_clip_tau=1e-4", "optim.update_clip=true", "optim.skip_step_sigma=6"],
    ],
    ids=["plain", "controls"],
)
def test_torchrun_two_processes_match_one_process(tmp_path, data_args, controls):
    common = [
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=5",
        "train.batch_size=8",
        "train.sample_tokens=0",
        *controls,
    ]
    assert train.main([*common, "--name", "single", "train.micro_batch_size=4"]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "train.py",
            *common,
            "--name",
            "ddp",
        ],
        cwd=train.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    single, ddp = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert len(ddp) == 5
    assert single == pytest.approx(ddp, rel=1e-4)
    assert json.loads((tmp_path / "ddp" / "meta.json").read_text())["world_size"] == 2
    if controls:  # the same heads rescaled, by the same factors, as one process over the batch
        key = "qk_clip/rescaled/layer_0"
        assert logged(tmp_path / "ddp", key) == logged(tmp_path / "single", key)
        assert sum(logged(tmp_path / "single", key)) > 0
        w = "layers.0.attention.wq.weight"
        ddp_w, one_w = (
            torch.load(tmp_path / n / "checkpoints" / "latest.pt", weights_only=False)["model"][w]
            for n in ("ddp", "single")
        )  # rank 0 scaled by its own half-batch max instead: ~10% off (measured)
        torch.testing.assert_close(ddp_w, one_w, rtol=1e-3, atol=1e-3 * one_w.abs().max().item())


@pytest.mark.slow
def test_wandb_offline_writes_run_files_and_disabled_imports_nothing(tmp_path, data_args):
    code = (
        "import sys, train; rc = train.main(sys.argv[1:]); "
        "sys.exit(rc or (10 if 'wandb' in sys.modules else 0))"
    )
    base = [
        sys.executable,
        "-c",
        code,
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=3",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    r = subprocess.run(
        [*base, "--name", "off"],
        cwd=train.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]  # 10 would mean wandb was imported while disabled
    last = r.stdout.strip().splitlines()[-1]  # the result line, not the progress bar drawn again
    assert "final val loss" in last and f"-> {tmp_path / 'off'}" in last, r.stdout[-2000:]
    r = subprocess.run(
        [*base, "--name", "on", "log.wandb=offline"],
        cwd=train.REPO,
        env={**env, "WANDB_SILENT": "true"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 10, r.stderr[-2000:]  # ran fine, and did use wandb
    runs = list((tmp_path / "on" / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb"))


@pytest.mark.slow
def _inside_a_long_step(tmp_path, data_args, name: str, fault: str):
    """train.py with step 3 made long by a fault (`stall`: one torch op of tens of seconds; `hang`:
    ten minutes), once steps 0 (L0), 1 and 2 are logged: (the process, its metrics file)."""
    cmd = [sys.executable, "train.py", "--config", TINY, f"log.out_dir={tmp_path}", *data_args,
           "--name", name, "train.steps=50", "train.checkpoint_every=1", "train.eval_every=1000",
           "train.sample_tokens=0"]  # fmt: skip
    env = {**os.environ, "NORMLAB_KILL_AT": f"step:3:{fault}"}  # after step 2's checkpoint
    proc = subprocess.Popen(
        cmd, cwd=train.REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    metrics, deadline = tmp_path / name / "metrics.jsonl", time.time() + 120
    while len(read_metrics(metrics)) < 3 and time.time() < deadline:
        time.sleep(0.1)
    return proc, metrics


@pytest.mark.slow  # a process in a step that waits out the 5 s grace
def test_a_second_signal_during_a_long_step_stops_at_once_and_the_checkpoint_resumes(
    tmp_path, data_args
):
    """SIGTERM during a step that takes a minute (one torch op: Python's signal handlers wait for it
    to return), then SIGTERM again: the process ends at once (it went on to the end of the step
    before; `timeout` did not stop such a run in 23 minutes, issue 42), exit 130, one line saying
    so; the last checkpoint is intact and resumes."""
    proc, metrics = _inside_a_long_step(tmp_path, data_args, "s", "stall")
    time.sleep(1.0)  # step 2's checkpoint written, step 3 inside its stall
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # a second signal, not the first one sent again
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED and time.time() - t0 < 5, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "interrupted again: stopped at once; the last "
        "checkpoint (step 2) is intact: --resume continues "
        "from it"
    ), err
    assert load_checkpoint(tmp_path / "s" / "checkpoints" / "latest.pt")["step"] == 2
    resume = ["--name", "s", "--resume", f"log.out_dir={tmp_path}", "train.steps=4"]
    assert train.main(resume) == EXIT_OK
    assert [r["step"] for r in read_metrics(metrics)] == list(range(0, 5))


@pytest.mark.slow  # a process in a step that waits out the 5 s grace
def test_one_sigterm_inside_a_long_step_ends_the_run_within_seconds(tmp_path, data_args):
    """One SIGTERM (what torchrun and SLURM send) during a step of ten minutes: the process ends
    STEP_GRACE_S later, exit 130, one line; the last whole checkpoint (step 2) stays and resumes."""
    from training.run import StopRequest

    proc, metrics = _inside_a_long_step(tmp_path, data_args, "h", "hang")
    time.sleep(1.0)  # step 3 inside its hang
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    took = time.time() - t0
    assert proc.returncode == EXIT_INTERRUPTED and took < 60, (took, err[-2000:])  # of 600 s
    assert took >= StopRequest.STEP_GRACE_S - 0.5
    assert err.strip().splitlines()[-1].startswith("interrupted inside a step longer than 5 s")
    assert load_checkpoint(tmp_path / "h" / "checkpoints" / "latest.pt")["step"] == 2


def test_help_answers_before_torch_is_imported():
    """`train.py --help` at once (it took 2-5 s importing torch); it points to docs/usage.md."""
    code = (
        "import runpy, sys\nsys.argv = ['train.py', '--help']\ntry:\n"
        "    runpy.run_path('train.py', run_name='__main__')\nexcept SystemExit as e:\n"
        "    assert e.code == 0\nprint('torch' in sys.modules)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=train.REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("False"), r.stdout + r.stderr
    assert "docs/usage.md" in r.stdout and "--resume" in r.stdout


class _StopAtOnce(train.StopRequest):
    """A Ctrl-C that arrived before the first step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requested = True


@pytest.mark.slow
def test_stop_request_stops_at_the_next_step_but_never_the_last(tmp_path, monkeypatch, run_tiny):
    monkeypatch.setattr(train, "StopRequest", _StopAtOnce)
    assert run_tiny("--name", "last", "train.steps=1") == EXIT_OK  # finishes: nothing to resume
    assert json.loads((tmp_path / "last" / "summary.json").read_text())["status"] in (
        "ok",
        "plateau",
    )
    assert run_tiny("--name", "early", "train.steps=3") == EXIT_INTERRUPTED
    assert load_checkpoint(tmp_path / "early" / "checkpoints" / "latest.pt")["step"] == 1


@pytest.mark.slow
def test_extending_a_finished_run_holds_the_final_lr(tmp_path, run_tiny):
    """Before: train.steps=24 on resume re-stretched the cosine, jumping the LR from its floor to
    near its peak."""
    assert run_tiny("--name", "x", "train.steps=12", "optim.lr=1e-2") == 0
    assert train.main(["--name", "x", "--resume", f"log.out_dir={tmp_path}", "train.steps=24"]) == 0
    lrs = losses(tmp_path / "x", "train/lr")
    assert (
        len(lrs) == 24 and lrs[11] == pytest.approx(1e-3) and lrs[12:] == [pytest.approx(1e-3)] * 12
    )
    assert "schedule_steps: 12" in (tmp_path / "x" / "config.yaml").read_text()
    event = json.loads((tmp_path / "x" / "meta.json").read_text())["resumes"][-1]
    assert (
        event["at_step"] == 12
        and event["schedule_steps"] == 12
        and "hold the final lr" in event["note"]
    )
    # an explicit new horizon re-schedules, and the run's files say so
    assert (
        train.main(
            [
                "--name",
                "x",
                "--resume",
                f"log.out_dir={tmp_path}",
                "train.steps=30",
                "optim.schedule_steps=40",
            ]
        )
        == 0
    )
    event = json.loads((tmp_path / "x" / "meta.json").read_text())["resumes"][-1]
    assert event["previous_schedule_steps"] == 12 and event["schedule_steps"] == 40
    assert event["lr_after"] > 3 * event["lr_before"] and "re-scheduled" in event["note"]


def test_checkpoint_from_more_gpus_than_visible_is_one_line(tmp_path, monkeypatch):
    """A checkpoint saved with 2 GPUs' RNG states, resumed where the process drives device 1 of... 1
    visible."""
    from training.checkpoint import CheckpointError, set_rng_state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    state = {"torch": torch.get_rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)] * 2}
    with pytest.raises(CheckpointError, match="RNG states for 2 devices"):
        set_rng_state(state)
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda s: (_ for _ in ()).throw(IndexError("list index"))
    )
    with pytest.raises(CheckpointError, match="cannot restore the RNG state"):
        set_rng_state({"torch": torch.get_rng_state(), "cuda": torch.zeros(16, dtype=torch.uint8)})
    with pytest.raises(CheckpointError, match="cannot restore the RNG state"):
        set_rng_state({"torch": torch.zeros(3)})


@pytest.mark.slow
def test_broken_rng_in_checkpoint_is_exit_2(tmp_path, capsys, run_tiny):
    assert run_tiny("--name", "r", "train.steps=4", "train.stop_at=2") == 0
    path = tmp_path / "r" / "checkpoints" / "latest.pt"
    state = load_checkpoint(path)
    state["rng"]["torch"] = torch.zeros(3, dtype=torch.uint8)
    save_checkpoint(path, state)
    capsys.readouterr()
    assert train.main(["--name", "r", "--resume", f"log.out_dir={tmp_path}"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "RNG" in err[0]


@pytest.mark.slow
def test_non_finite_final_val_loss_is_diverged_not_a_crash(tmp_path, monkeypatch, run_tiny):
    """Before: sampling from NaN logits raised in torch.multinomial: exit 1, no summary.json."""
    real, calls = train.evaluate, []

    # eval_every > steps: called at step 0 (L0), then after the last
    def nan_at_the_end(model, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return real(model, *args, **kwargs)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))  # the weights went bad in the last step
        return {"val/loss": float("nan"), "val/loss_se": float("nan"), "val/bpb": float("nan")}

    monkeypatch.setattr(train, "evaluate", nan_at_the_end)
    code = run_tiny("--name", "n", "train.steps=4", "train.eval_every=100")
    assert code == EXIT_DIVERGED
    summary = json.loads((tmp_path / "n" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_at"] == 4


@pytest.mark.slow
def test_wandb_receives_the_retrained_steps_after_a_crash(tmp_path, monkeypatch, run_tiny):
    """A crash after step 6 with the checkpoint at 4: the resume re-trains 5 and 6. wandb drops
    records logged at or below the last step it received, so they must be logged against our own
    step metric, not wandb's step."""
    pytest.importorskip("wandb")
    from wandb.sdk import wandb_run

    sent, axes = [], []
    real_log, real_define = wandb_run.Run.log, wandb_run.Run.define_metric
    monkeypatch.setattr(
        wandb_run.Run,
        "log",
        lambda self, data, step=None, **kw: (
            sent.append((dict(data), step)),
            real_log(self, data, step=step, **kw),
        )[1],
    )
    monkeypatch.setattr(
        wandb_run.Run,
        "define_metric",
        lambda self, name, *a, **kw: (
            axes.append((name, kw.get("step_metric"))),
            real_define(self, name, *a, **kw),
        )[1],
    )
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    common = [f"log.out_dir={tmp_path}", "log.wandb=offline"]
    assert (
        run_tiny(
            "--name",
            "w",
            "train.steps=8",
            "train.checkpoint_every=4",
            "train.stop_at=4",
            "log.wandb=offline",
        )
        == 0
    )
    ckpt = tmp_path / "w" / "checkpoints" / "latest.pt"
    at_4 = ckpt.read_bytes()
    assert train.main(["--name", "w", "--resume", *common, "train.stop_at=6"]) == 0
    ckpt.write_bytes(at_4)  # the crash: steps 5 and 6 were logged, the checkpoint still says 4
    assert train.main(["--name", "w", "--resume", *common, "train.stop_at=0"]) == 0
    assert ("*", "train/step") in axes and all(step is None for _, step in sent)
    logged = [d["train/step"] for d, _ in sent if "train/loss" in d]
    assert logged == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]  # the re-trained 5 and 6 are sent again
    final = {
        d["train/step"]: d["train/loss"] for d, _ in sent if "train/loss" in d
    }  # last value per step
    # the dashboard ends where metrics.jsonl does
    assert [final[s] for s in range(1, 9)] == losses(tmp_path / "w")
    assert len(list((tmp_path / "w" / "wandb").glob("offline-run-*"))) == 3


@pytest.mark.parametrize("placement", sorted(BLOCKS))
def test_every_registered_placement_trains_through_train_py(tmp_path, placement, run_tiny):
    assert (
        run_tiny(
            "--name", placement, "--placement", placement, "train.steps=6", "train.sample_tokens=0"
        )
        == 0
    )
    loss = losses(tmp_path / placement)
    assert len(loss) == 6 and all(v == v for v in loss) and loss[-1] < loss[0]


@pytest.mark.parametrize("norm", sorted(NORMS))
def test_every_registered_norm_trains_through_train_py(tmp_path, norm, run_tiny):
    assert run_tiny("--name", norm, "--norm", norm, "train.steps=6", "train.sample_tokens=0") == 0
    loss = losses(tmp_path / norm)
    assert len(loss) == 6 and all(v == v for v in loss) and loss[-1] < loss[0]
