"""The stability controls (training/controls.py) against their definitions computed here:
OLMo-core's skip-step z-scores, StableAdamW's RMS_t and update clipping, Kimi K2's QK-Clip."""

import math
import statistics

import pytest
import torch

from model.args import ModelArgs
from model.llama import Llama
from training.controls import SkipStep, UpdateClip, qk_clip, rms_t, rms_t_by_layer


def test_skip_step_skips_a_six_sigma_outlier_of_the_last_128_steps_once_it_has_64():
    skip = SkipStep(sigma=6.0, window=128)
    values = [1.0 + 0.01 * math.sin(i) for i in range(63)]
    assert not any(skip.skip(v, 1.0 + v) for v in values)  # fewer than 64 seen: never
    assert not skip.skip(100.0, 2.0)  # the 64th value is judged on 63 before it: no, too few
    skip = SkipStep(sigma=6.0, window=128)
    for v in values + [1.0, 1.01]:
        skip.skip(v, 0.5)
    history = list(skip.losses)
    mean, sd = statistics.fmean(history), statistics.stdev(history)
    assert skip.skip(mean + 5.9 * sd, 0.5) is False
    history = list(skip.losses)
    mean, sd = statistics.fmean(history), statistics.stdev(history)
    assert skip.skip(mean + 6.1 * sd, 0.5) is True  # the loss alone
    assert len(skip.losses) == 67  # a skipped step's values join the window, as OLMo-core's
    for i in range(200):
        skip.skip(1.0 + 0.01 * math.cos(i), 0.5 + 0.01 * math.sin(i))
    assert len(skip.losses) == len(skip.norms) == 128
    assert skip.skip(1.0, 50.0) is True  # the grad norm alone


def _adamw(p, lr=0.1):
    return torch.optim.AdamW([p], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def test_rms_t_is_the_rms_of_g_squared_over_the_corrected_second_moment():
    """RMS_t = sqrt(mean(g_t^2 / v_hat_t)), v_t = b2 v_{t-1} + (1 - b2) g_t^2,
    v_hat = v / (1 - b2^t), in float64 by hand over three steps; at step 1 it is exactly 1."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64))
    opt = _adamw(p)
    v = torch.zeros(5, 3, dtype=torch.float64)
    for t in range(1, 4):
        p.grad = torch.randn(5, 3, dtype=torch.float64) * t
        v = 0.95 * v + 0.05 * p.grad**2
        want = (p.grad**2 / (v / (1 - 0.95**t))).mean().sqrt()
        got = rms_t(opt)[p]
        assert got.item() == pytest.approx(want.item(), rel=1e-6)
        if t == 1:
            assert got.item() == pytest.approx(1.0)
        opt.step()


def test_update_clipping_divides_each_tensors_step_by_max_1_rms_t():
    torch.manual_seed(1)
    a = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    b = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    opt, ref = _adamw(a), _adamw(b)
    b.data.copy_(a.data)
    clip, clipped = UpdateClip(), 0
    for t in range(6):
        g = torch.randn(4, 4, dtype=torch.float64) * (50.0 if t == 4 else 1.0)  # a jump at t = 4
        a.grad, b.grad = g.clone(), g.clone()
        rms = rms_t(opt)[a].item()
        before = a.detach().clone()
        frac = clip.prepare(opt, rms_t(opt))
        opt.step()
        clip.apply()
        ref_before = b.detach().clone()
        ref.step()
        want = ref_before + (b.detach() - ref_before) / max(1.0, rms)
        torch.testing.assert_close(a.detach(), want, rtol=1e-12, atol=1e-12)
        b.data.copy_(a.data)  # the reference continues from the clipped parameters
        assert frac == (1.0 if rms > 1 else 0.0)
        assert before.shape == a.shape
        clipped += rms > 1
    assert clipped >= 1  # the jump at t = 4 is clipped


def test_qk_clip_caps_every_head_above_tau_at_tau_and_leaves_the_others():
    torch.manual_seed(0)
    model = Llama(ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64))
    att = model.layers[0].attention
    with torch.no_grad():
        att.wq.weight[: 2 * att.head_dim] *= 400.0  # heads 0 and 1: logits far above 10
    for block in model.layers:
        block.attention.track_max_logit = True
    idx = torch.randint(0, 64, (2, 12))
    model(idx)
    before = att.max_logit.clone()
    assert before[:2].min() > 10 and before[2:].max() < 10
    out = qk_clip(model, 10.0)
    assert out == {"qk_clip/rescaled/layer_0": 2.0, "qk_clip/rescaled/layer_1": 0.0}
    assert att.max_logit is None  # reset for the next step
    model(idx)
    torch.testing.assert_close(att.max_logit[:2], torch.full((2,), 10.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(att.max_logit[2:], before[2:])
    with torch.no_grad():  # evals do not record
        att.max_logit = None
        model(idx)
    assert att.max_logit is None


def test_rms_t_by_layer_pools_a_blocks_tensors():
    model = Llama(ModelArgs(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32))
    rms = {
        p: torch.tensor(2.0 if n.startswith("layers.1.") else 1.0)
        for n, p in model.named_parameters()
    }
    out = rms_t_by_layer(model, rms)
    assert out["optim/rms_t/layer_0"] == pytest.approx(1.0)
    assert out["optim/rms_t/layer_1"] == pytest.approx(2.0)
    assert {"optim/rms_t/tok_embeddings", "optim/rms_t/output", "optim/rms_t/norm"} <= set(out)


def test_every_control_runs_through_train_py_and_logs_what_it_did(tmp_path, run_tiny):
    """train.py with skip-step, update clipping and QK-Clip on (tau low enough to bite) and the
    probe every 2 steps: each step logs whether it skipped and the share of tensors clipped, probe
    steps log RMS_t per layer, QK-Clip the heads it rescaled; the run trains."""
    from conftest import logged

    args = ("optim.update_clip=true", "optim.skip_step_sigma=6", "optim.skip_step_window=4")
    code = run_tiny(
        "--name",
        "c",
        *args,
        "optim.qk_clip_tau=1e-4",
        "train.steps=8",
        "log.stats_every=2",
        "train.sample_tokens=0",
    )
    assert code == 0
    run = tmp_path / "c"
    assert len(logged(run, "optim/skipped")) == 8 and len(logged(run, "optim/update_clipped")) == 8
    assert len(logged(run, "optim/rms_t/layer_0")) == 8  # update clipping computes it every step
    assert sum(logged(run, "qk_clip/rescaled/layer_0")) > 0
    loss = logged(run)
    assert loss[-1] < loss[0]


def test_a_control_under_fsdp_or_tp_is_refused_in_one_line(tmp_path, run_tiny, capsys):
    code = run_tiny("--name", "r", "optim.update_clip=true", "train.parallel=fsdp")
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("they run with train.parallel=ddp, got fsdp")


def test_a_run_without_controls_logs_rms_t_on_the_probes_steps_only(tmp_path, run_tiny):
    """RMS_t is a spike precursor in every run: with every control off, train.py logs it per layer
    on the probe's steps (log.stats_every) and nothing a control would log."""
    from conftest import logged

    from training.rundir import read_metrics

    code = run_tiny("--name", "n", "train.steps=6", "log.stats_every=2", "train.sample_tokens=0")
    assert code == 0
    run = tmp_path / "n"
    steps = {r["step"] for r in read_metrics(run / "metrics.jsonl") if "optim/rms_t/layer_0" in r}
    probed = {r["step"] for r in read_metrics(run / "metrics.jsonl") if "grad/norm/layer_0" in r}
    assert steps == probed == {1, 2, 4, 6}  # the probe's steps: the first, then every 2nd
    assert logged(run, "optim/skipped") == [] and logged(run, "optim/update_clipped") == []
    assert all(0 < v < 10 for v in logged(run, "optim/rms_t/layer_1"))
