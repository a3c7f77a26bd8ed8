"""The instabilities' interventions (Wortsman et al. 2023) against hand-written references: qk-norm
as its own choice (and the old boolean spelling), attention and output logit soft-capping (float64
math), attention entropy, the z-loss term logged apart, coupled vs independent weight decay and
muParam (simple)'s per-group LRs (one AdamW step computed by hand in float64)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_args

from model import Llama
from model.layers import attention_path, explicit_attention
from model.norms import LayerNorm, NoNorm, RMSNorm
from model.rope import apply_rope
from normlab import attention as metrics
from normlab.probe import StabilityProbe
from training.config import ConfigError, OptimConfig, load_config, to_yaml
from training.optim import build_optimizer, lr_at, param_groups, set_lr


# -- qk-norm -----------------------------------------------------------------------------------
@pytest.mark.parametrize("block", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("qk", ["none", "rmsnorm", "layernorm"])
def test_qk_norm_is_its_own_choice_whatever_the_block_norm(block, qk):
    """qk-LayerNorm under RMSNorm blocks and the other way round: the qk-norm's kind and eps are its
    own, a gain per head dim and no bias; the queries attention sees are that norm of each head
    (then RoPE), in float64."""
    torch.manual_seed(0)
    model = Llama(
        tiny_args(norm=block, qk_norm=qk, qk_norm_eps=1e-3, norm_eps=1e-6, norm_impl="reference")
    ).double()
    att = model.layers[0].attention
    want = {"none": NoNorm, "rmsnorm": RMSNorm, "layernorm": LayerNorm}[qk]
    assert type(att.q_norm) is want and type(att.k_norm) is want
    assert (
        type(model.layers[0].attention_norm) is {"rmsnorm": RMSNorm, "layernorm": LayerNorm}[block]
    )
    if qk != "none":
        assert (
            att.q_norm.eps == 1e-3 and att.q_norm.bias is None and att.q_norm.weight.shape == (8,)
        )
        with torch.no_grad():
            att.q_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    rope = (model.rope_cos[:5], model.rope_sin[:5])
    q = (x @ att.wq.weight.T).view(2, 5, 4, 8)
    if qk == "layernorm":
        q = (q - q.mean(-1, keepdim=True)) / (q.var(-1, unbiased=False, keepdim=True) + 1e-3).sqrt()
    elif qk == "rmsnorm":
        q = q / (q.pow(2).mean(-1, keepdim=True) + 1e-3).sqrt()
    if qk != "none":
        q = q * att.q_norm.weight
    want_q = apply_rope(q, rope).transpose(1, 2)
    torch.testing.assert_close(att.qk(x, rope)[0], want_q, rtol=1e-12, atol=1e-12)


def test_qk_norm_eps_defaults_to_the_norm_eps():
    att = Llama(tiny_args(qk_norm="layernorm", norm_eps=1e-4)).layers[0].attention
    assert att.q_norm.eps == att.k_norm.eps == 1e-4


def test_the_old_boolean_qk_norm_is_refused_with_the_valid_names(tmp_path):
    """`qk_norm: true` (the block norm per head, before qk_norm was a choice) is no longer read: it
    raises with the names that replace it (qknorm-control's `true` under RMSNorm blocks is
    `rmsnorm`)."""
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(load_config(None)).replace("qk_norm: none", "qk_norm: true"))
    with pytest.raises(
        ConfigError, match="unknown qk_norm 'True'; valid: layernorm, none, olmo2, rmsnorm"
    ):
        load_config(path)


def test_a_bad_qk_norm_or_softcap_is_one_line():
    with pytest.raises(
        ConfigError, match="unknown qk_norm 'lay'; valid: layernorm, none, olmo2, rmsnorm"
    ):
        load_config(None, ["model.qk_norm=lay"])
    with pytest.raises(ConfigError, match=r"model.attn_softcap=-1.0 must be a finite number >= 0"):
        load_config(None, ["model.attn_softcap=-1"])
    with pytest.raises(ConfigError, match=r"model.qk_norm_eps=0.0 must be a finite number > 0"):
        load_config(None, ["model.qk_norm_eps=0"])


# -- soft-capping ------------------------------------------------------------------------------
def _reference_attention(q, k, v, cap: float) -> torch.Tensor:
    """Causal attention written out per query in float64: z_ij = q_i.k_j / sqrt(d), cap tanh(z /
    cap), softmax over j <= i, sum_j a_ij v_j; kv head g serves query heads g * H / kv ...."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, T, hd = q.shape
    out = torch.zeros(B, H, T, hd, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // (H // k.shape[1])
            for i in range(T):
                z = k[b, g, : i + 1] @ q[b, h, i] / math.sqrt(hd)
                if cap:
                    z = cap * torch.tanh(z / cap)
                a = torch.exp(z - z.max())
                out[b, h, i] = (a / a.sum()) @ v[b, g, : i + 1]
    return out


@pytest.mark.parametrize("cap", [0.0, 2.0, 30.0])
def test_explicit_attention_with_a_softcap_matches_a_float64_reference(cap):
    """Logits up to ~15 in magnitude: a cap of 2 changes them a lot, 30 a little, 0 not at; float32
    within 1e-5."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8) * 2, torch.randn(2, 2, 6, 8) * 2, torch.randn(2, 2, 6, 8)
    y = explicit_attention(q, k, v, cap)
    torch.testing.assert_close(y.double(), _reference_attention(q, k, v, cap), rtol=1e-5, atol=1e-5)
    # and its gradients are the formula's
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda a, b, c: explicit_attention(a, b, c, cap), (q64, k64, v64)
    )


def test_explicit_attention_equals_sdpa_with_the_cap_off():
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 4, 9, 8), torch.randn(3, 2, 9, 8), torch.randn(3, 2, 9, 8)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        a, b, c = (t.to(dtype) for t in (q, k, v))
        sdpa = F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(explicit_attention(a, b, c, 0.0), sdpa, rtol=tol, atol=tol)


def test_a_model_with_a_cap_far_above_its_logits_equals_the_sdpa_model():
    """The forward dispatch: attn_softcap > 0 runs the explicit path; a cap of 1e6 changes logits of
    size ~1 by ~1e-12, so the two models' outputs agree to float32 noise."""
    torch.manual_seed(0)
    a = Llama(tiny_args())
    torch.manual_seed(0)
    b = Llama(tiny_args(attn_softcap=1e6))
    idx = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(b(idx)[0], a(idx)[0], rtol=1e-5, atol=1e-6)
    assert attention_path(b.args).startswith(
        "explicit"
    ) and "scaled_dot_product_attention" in attention_path(a.args)


def test_output_softcap_matches_a_float64_reference():
    """logits = c tanh(raw / c) with raw the head's output, and the loss is the cross-entropy of the
    capped logits: logsumexp - the target's logit, per position, in float64."""
    cap = 0.5
    torch.manual_seed(0)
    raw_model = Llama(tiny_args(init_std=0.5)).double()  # logits of size ~5: the cap of 0.5 bites
    torch.manual_seed(0)
    model = Llama(tiny_args(init_std=0.5, logit_softcap=cap)).double()
    idx, targets = torch.randint(0, 64, (2, 2, 16))
    raw = raw_model(idx)[0]
    assert raw.abs().max() > 4 * cap
    want = cap * torch.tanh(raw / cap)
    logits, loss = model(idx, targets)
    torch.testing.assert_close(logits, want, rtol=1e-12, atol=1e-12)
    assert logits.abs().max() < cap
    flat = want.flatten(0, 1)
    ce = (torch.logsumexp(flat, -1) - flat[torch.arange(flat.shape[0]), targets.flatten()]).mean()
    torch.testing.assert_close(loss, ce, rtol=1e-12, atol=1e-12)


def test_the_output_softcap_runs_in_float32_under_bfloat16_autocast():
    model = Llama(tiny_args(logit_softcap=30.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(*torch.randint(0, 64, (2, 2, 16)))
    assert logits.dtype == torch.float32 and torch.isfinite(loss)


# -- attention entropy
# ------------------------------------------------------------------------------------------------
def _reference_entropy(q, k, cap: float) -> float:
    """Mean over batch, heads and query positions of -sum_j a_ij log a_ij, a_i the causal softmax,
    in float64."""
    q, k = q.double(), k.double()
    B, H, T, hd = q.shape
    total = 0.0
    for b in range(B):
        for h in range(H):
            g = h // (H // k.shape[1])
            for i in range(T):
                z = k[b, g, : i + 1] @ q[b, h, i] / math.sqrt(hd)
                z = cap * torch.tanh(z / cap) if cap else z
                logp = z - torch.logsumexp(z, 0)
                total -= (logp.exp() * logp).sum().item()
    return total / (B * H * T)


@pytest.mark.parametrize("cap", [0.0, 3.0])
def test_attention_entropy_matches_a_float64_reference(monkeypatch, cap):
    """Constructed q and k: heads from near-uniform (small q) to near one-hot (a large q), entropy
    in nats; the chunked pass (MAX_SCORES forcing one sequence at a time) gives the same numbers;
    logit_max stays the uncapped max |q.k| / sqrt(d)."""
    torch.manual_seed(0)
    q = torch.randn(3, 4, 7, 8) * torch.tensor([0.01, 1.0, 3.0, 30.0]).view(1, 4, 1, 1)
    k = torch.randn(3, 2, 7, 8)
    logit_max, entropy = metrics.qk_stats(q, k, cap)
    assert entropy.item() == pytest.approx(_reference_entropy(q, k, cap), rel=1e-5)
    uniform = sum(math.log(i + 1) for i in range(7)) / 7  # the entropy's ceiling: every key alike
    assert 0 < entropy.item() < uniform
    kk = k.double().repeat_interleave(2, dim=1)
    scores = (q.double() @ kk.transpose(-1, -2)).abs() / math.sqrt(8)
    assert logit_max.item() == pytest.approx(
        scores[..., torch.ones(7, 7).tril().bool()].max().item(), rel=1e-6
    )
    monkeypatch.setattr(metrics, "MAX_SCORES", 1)  # one sequence per chunk
    chunked = metrics.qk_stats(q, k, cap)
    assert chunked[0].item() == pytest.approx(logit_max.item(), rel=1e-6)
    assert chunked[1].item() == pytest.approx(entropy.item(), rel=1e-6)
    # zero logits: uniform
    assert metrics.qk_stats(q * 0, k)[1].item() == pytest.approx(uniform, rel=1e-6)


def test_the_probe_logs_each_layers_attention_entropy_from_its_input():
    """attn/entropy/layer_{i} is the entropy of layer i's attention on this step's input (qk_stats
    of attention.qk), averaged over forward passes; with a softcap, of the capped logits the layer
    uses."""
    torch.manual_seed(0)
    model = Llama(tiny_args(attn_softcap=2.0, init_std=0.2))
    x = torch.randint(0, 64, (2, 3, 16))
    inputs = {}
    handles = [
        b.attention.register_forward_pre_hook(lambda m, a, i=i: inputs.setdefault(i, []).append(a))
        for i, b in enumerate(model.layers)
    ]
    probe = StabilityProbe(model)
    probe.attach()
    for xm in x:
        model(xm)
    got = probe.finish()
    for h in handles:
        h.remove()
    for i, block in enumerate(model.layers):
        with torch.no_grad():
            want = [metrics.qk_stats(*block.attention.qk(*a), 2.0)[1].item() for a in inputs[i]]
        assert got[f"attn/entropy/layer_{i}"] == pytest.approx(sum(want) / len(want), rel=1e-6)
        assert 0 < got[f"attn/entropy/layer_{i}"] < math.log(16)


# -- weight decay and parametrization
# ---------------------------------------------------------------------------------
def _one_step(cfg: OptimConfig, lr: float, model=None):
    """A float64 tiny model with known parameters and gradients, one AdamW step at scheduled LR
    `lr`: (before, after, grads, model)."""
    torch.manual_seed(0)
    model = model or Llama(tiny_args(norm_impl="reference")).double()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, cfg)
    set_lr(opt, lr)
    opt.step()
    return (
        before,
        dict(model.named_parameters()),
        {n: p.grad for n, p in model.named_parameters()},
        model,
    )


def _adamw_first_step(p, g, lr: float, decay: float, eps: float) -> torch.Tensor:
    """AdamW's first step by hand: m_hat = g, v_hat = g^2 (bias-corrected), p (1 - decay) - lr g /
    (|g| + eps)."""
    return p * (1 - decay) - lr * g / (g.abs() + eps)


@pytest.mark.parametrize("mode", ["coupled", "independent"])
@pytest.mark.parametrize("peak", [1e-3, 1e-2])
@pytest.mark.parametrize("at", [1.0, 0.25])  # the scheduled LR as a share of the peak
def test_one_adamw_step_equals_the_hand_computed_update(mode, peak, at):
    """Coupled: the decay of the step is wd * lr(t) (torch's AdamW). Independent: wd * lr(t) / peak,
    so at the peak it is wd whatever the peak LR, and a quarter of it at a quarter of the peak.
    Matrices decay; the embedding and the norm gains do not."""
    wd = 0.1 if mode == "coupled" else 1e-4
    cfg = OptimConfig(lr=peak, weight_decay=wd, weight_decay_mode=mode)
    lr = peak * at
    before, after, grads, _ = _one_step(cfg, lr)
    decay = wd * lr if mode == "coupled" else wd * at
    for name, p in after.items():
        matrix = name.endswith(
            (
                "wq.weight",
                "wk.weight",
                "wv.weight",
                "wo.weight",
                "w1.weight",
                "w2.weight",
                "w3.weight",
                "output.weight",
            )
        )
        want = _adamw_first_step(before[name], grads[name], lr, decay if matrix else 0.0, cfg.eps)
        torch.testing.assert_close(p.detach(), want, rtol=1e-13, atol=1e-15, msg=name)


@pytest.mark.parametrize("mode", ["coupled", "independent"])
def test_an_lr_factor_run_is_the_run_at_the_multiplied_lr(mode):
    """optim.lr_factor k at lr is the run at k lr: every scheduled LR, and one AdamW step (decay
    included) bit for bit; the lab still files it under lr."""
    a = OptimConfig(lr=0.25, lr_factor=2.0, weight_decay=0.1, weight_decay_mode=mode)
    b = OptimConfig(lr=0.5, weight_decay=0.1, weight_decay_mode=mode)
    assert [lr_at(s, a, 50) for s in range(50)] == [lr_at(s, b, 50) for s in range(50)]
    _, after_a, _, _ = _one_step(a, lr_at(40, a, 50))
    _, after_b, _, _ = _one_step(b, lr_at(40, b, 50))
    for name, p in after_a.items():
        assert torch.equal(p, after_b[name]), name
    assert a.lr == 0.25


def test_independent_decay_at_the_peak_does_not_depend_on_the_lr():
    shrink = {}
    for peak in (1e-3, 1e-1):
        cfg = OptimConfig(lr=peak, weight_decay=1e-4, weight_decay_mode="independent")
        groups = param_groups(Llama(tiny_args()), cfg)
        # AdamW's lr * weight_decay
        shrink[peak] = peak * groups[0]["lr_scale"] * groups[0]["weight_decay"]
    assert shrink[1e-3] == pytest.approx(1e-4, rel=1e-12) and shrink[1e-1] == pytest.approx(
        1e-4, rel=1e-12
    )


def test_the_standard_parametrization_keeps_its_two_groups():
    """sp: [decayed matrices, everything else] with lr_scale 1 and the configured decay, as before
    (old optimizer states load into it, and every run stays bit-identical)."""
    model = Llama(tiny_args())
    decay, no_decay = param_groups(model, OptimConfig())
    matrices = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert {id(p) for p in decay["params"]} == matrices and decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0 and decay["lr_scale"] == no_decay["lr_scale"] == 1.0


@pytest.mark.parametrize("tie", [False, True])
def test_mup_simple_scales_every_linear_layers_lr_by_base_over_width(tie):
    """Width 128 over a base of 32: every linear layer's weight (q, k, v, o, w1, w2, w3, an untied
    head) gets LR x 0.25; the embedding (a tied head is the embedding), the norm gains keep the
    scheduled LR. One step of a matrix is the hand-computed one at lr / 4, independent decay still
    wd * lr(t) / peak."""
    args = tiny_args(dim=128, n_heads=4, tie_embeddings=tie, norm_impl="reference")
    cfg = OptimConfig(
        lr=1e-2,
        parametrization="mup_simple",
        mup_base_width=32,
        weight_decay=1e-4,
        weight_decay_mode="independent",
    )
    torch.manual_seed(0)
    model = Llama(args).double()
    opt = build_optimizer(model, cfg)
    set_lr(opt, 4e-3)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        linear = name.split(".")[-2] in ("wq", "wk", "wv", "wo", "w1", "w2", "w3", "output")
        assert lr_of[id(p)] == pytest.approx(4e-3 * (0.25 if linear else 1.0), rel=1e-15), name
    assert ("output.weight" in dict(model.named_parameters())) is not tie
    before, after, grads, _ = _one_step(cfg, 4e-3, model=Llama(args).double())
    for name in (
        "layers.0.attention.wq.weight",
        "layers.1.feed_forward.w2.weight",
        "tok_embeddings.weight",
    ):
        lr = 4e-3 * (1.0 if name.startswith("tok") else 0.25)
        decay = 0.0 if name.startswith("tok") else 1e-4 * 0.4  # lr(t) / peak = 0.4
        want = _adamw_first_step(before[name], grads[name], lr, decay, cfg.eps)
        torch.testing.assert_close(after[name].detach(), want, rtol=1e-13, atol=1e-15, msg=name)


def test_mup_simple_at_its_base_width_is_the_standard_parametrization():
    model = Llama(tiny_args())  # dim 32
    sp = param_groups(model, OptimConfig())
    mup = param_groups(model, OptimConfig(parametrization="mup_simple", mup_base_width=32))
    assert [(len(g["params"]), g["lr_scale"], g["weight_decay"]) for g in mup] == [
        (len(g["params"]), g["lr_scale"], g["weight_decay"]) for g in sp
    ]


def test_bad_optimizer_choices_are_one_line():
    with pytest.raises(
        ConfigError, match="optim.weight_decay_mode='decoupled' is not one of: coupled, independent"
    ):
        load_config(None, ["optim.weight_decay_mode=decoupled"])
    with pytest.raises(
        ConfigError, match="optim.parametrization='mup' is not one of: mup_simple, sp"
    ):
        load_config(None, ["optim.parametrization=mup"])
    with pytest.raises(ConfigError, match=r"optim.mup_base_width=0 must be an integer >= 1"):
        load_config(None, ["optim.mup_base_width=0"])


def test_the_schedule_share_is_what_independent_decay_follows():
    """lr_at / peak is the s_t of Wortsman et al.'s update: warmup from 1/warmup to 1, then down to
    min_lr_ratio."""
    cfg = OptimConfig(lr=3e-3, warmup_steps=4, min_lr_ratio=0.1)
    shares = [lr_at(s, cfg, 20) / cfg.lr for s in range(20)]
    assert (
        shares[0] == pytest.approx(0.25)
        and shares[3] == pytest.approx(1.0)
        and shares[-1] == pytest.approx(0.1)
    )


# -- z-loss and the run's records
# -------------------------------------------------------------------------------------
def test_z_loss_is_logged_apart_from_the_cross_entropy():
    """train/log_z2 = the mean over micro-batches of mean log(Z)^2 (float64 reference from the
    step's logits), train/z_loss = its coefficient times that (the term added to the objective),
    train/loss the cross-entropy alone; without z-loss neither is logged."""
    from training.step import StepParts, autocast_for, train_step

    torch.manual_seed(0)
    model = Llama(tiny_args(init_std=0.3))
    x, y = torch.randint(0, 64, (2, 4, 16))
    with torch.no_grad():
        parts = [model(xm, ym) for xm, ym in zip(x.split(2), y.split(2), strict=True)]
    want_z2 = sum(torch.logsumexp(lg.double(), -1).pow(2).mean().item() for lg, _ in parts) / 2
    want_ce = sum(loss.item() for _, loss in parts) / 2
    for coef in (1e-2, 0.0):
        torch.manual_seed(0)
        model = Llama(tiny_args(init_std=0.3))
        opt = build_optimizer(model, OptimConfig())
        p = StepParts(
            model=model,
            ddp=model,
            compiled=model,
            opt=opt,
            micro=2,
            accum=2,
            world_size=1,
            device=torch.device("cpu"),
            autocast=autocast_for(torch.device("cpu"), "float32"),
            z_loss=coef,
            clip=math.inf,
            tokens_per_step=64,
        )
        record = train_step(p, (x, y), 1e-3).record
        assert record["train/loss"] == pytest.approx(want_ce, rel=1e-6)
        if coef:
            assert record["train/log_z2"] == pytest.approx(want_z2, rel=1e-5)
            assert record["train/z_loss"] == pytest.approx(coef * want_z2, rel=1e-5)
        else:
            assert "train/z_loss" not in record and "train/log_z2" not in record


def test_a_run_with_every_intervention_records_them(tmp_path, run_tiny):
    """train.py with qk-LayerNorm under RMSNorm blocks, both caps, z-loss, independent decay and
    mup_simple: it learns, meta.json names the explicit attention path, the z terms are logged at
    every step and the attention entropy at every probe step."""
    assert (
        run_tiny(
            "--name",
            "w",
            "model.qk_norm=layernorm",
            "model.attn_softcap=20",
            "model.logit_softcap=30",
            "train.z_loss=1e-4",
            "optim.weight_decay=1e-4",
            "optim.weight_decay_mode=independent",
            "optim.parametrization=mup_simple",
            "optim.mup_base_width=16",
            "optim.lr=1e-2",
        )
        == 0
    )
    meta = json.loads((tmp_path / "w" / "meta.json").read_text())
    assert meta["kernels"]["attention"].startswith("explicit")
    records = [
        json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 20 and all(
        r["train/z_loss"] == pytest.approx(1e-4 * r["train/log_z2"]) for r in steps
    )
    probed = [r for r in records if "attn/entropy/layer_0" in r]
    assert [r["step"] for r in probed] == [1, 5, 10, 15, 20]
    assert all(0 < r[f"attn/entropy/layer_{i}"] < math.log(32) for r in probed for i in (0, 1))
    summary = json.loads((tmp_path / "w" / "summary.json").read_text())
    assert summary["final_val_loss"] < records[0]["val/loss"]


# -- the study report's log Z figure
# ----------------------------------------------------------------------------------
def _logz_run(
    root, name: str, z_loss: float, lr: float, seed: int, log_z: list, norm: str = "rmsnorm"
):
    """A finished run directory made by hand: its config (z-loss, norm, LR, seed) and logits/log_z
    records."""
    from conftest import TINY

    cfg = load_config(
        TINY,
        [f"train.z_loss={z_loss}", f"model.norm={norm}", f"optim.lr={lr}", f"train.seed={seed}"],
    )
    d = root / "runs" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(to_yaml(cfg))
    records = [{"step": 0, "val/loss": 5.0}]
    records += [
        {
            "step": s,
            "train/loss": 5.0 - 0.1 * s,
            "grad/norm": 1.0,
            "attn/logit_max/layer_0": 1.0 + s,
            "logits/log_z": v,
        }
        for s, v in enumerate(log_z, 1)
    ]
    records += [{"step": len(log_z), "val/loss": 3.0}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": "ok",
                "final_val_loss": 3.0,
                "best_val_loss": 3.0,
                "unigram_entropy": 4.0,
                "tokens_per_s": 1000.0,
            }
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("axis", ["z_loss", "norm"])
def test_the_log_z_figure_is_drawn_where_the_arms_differ_in_z_loss_or_decay(tmp_path, axis):
    """Arms that differ in train.z_loss, runs that logged logits/log_z: log_z.png is drawn and the
    report shows it; arms that differ only in their norm: no such figure."""
    from lab.report import write_report

    for seed in (0, 1):
        for lr in (1e-3, 1e-2):
            for arm in (0, 1):
                z, norm = (
                    (1e-4 * arm, "rmsnorm")
                    if axis == "z_loss"
                    else (0.0, ["rmsnorm", "layernorm"][arm])
                )
                _logz_run(
                    tmp_path,
                    f"a{arm}-{lr}-{seed}",
                    z,
                    lr,
                    seed,
                    [6.0, 4.0 - arm, 2.0 - 2 * arm],
                    norm,
                )
    text = write_report([tmp_path], tmp_path / "out", margin=0.02).read_text()
    drawn = (tmp_path / "out" / "log_z.png").is_file()
    assert drawn == (axis == "z_loss") and ("(log_z.png)" in text) == drawn
    if drawn:
        assert (tmp_path / "out" / "log_z.png").stat().st_size > 1000
