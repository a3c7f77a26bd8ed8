"""The instabilities' interventions (Wortsman et al. 2023) against hand-written references: qk-norm as its own
choice (and the old boolean spelling), attention and output logit soft-capping (float64 math), attention entropy,
the z-loss term logged apart, coupled vs independent weight decay and muParam (simple)'s per-group LRs (one AdamW
step computed by hand in float64)."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_args

from model import Llama
from model.layers import apply_rope, attention_path, explicit_attention
from model.norms import LayerNorm, NoNorm, RMSNorm
from training import metrics
from training.config import ConfigError, load_config, to_yaml


# -- qk-norm ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("qk", ["none", "rmsnorm", "layernorm"])
def test_qk_norm_is_its_own_choice_whatever_the_block_norm(block, qk):
    """qk-LayerNorm under RMSNorm blocks and the other way round: the qk-norm's kind and eps are its own, a gain per
    head dim and no bias; the queries attention sees are that norm of each head (then RoPE), in float64."""
    torch.manual_seed(0)
    model = Llama(tiny_args(norm=block, qk_norm=qk, qk_norm_eps=1e-3, norm_eps=1e-6, norm_impl="reference")).double()
    att = model.layers[0].attention
    want = {"none": NoNorm, "rmsnorm": RMSNorm, "layernorm": LayerNorm}[qk]
    assert type(att.q_norm) is want and type(att.k_norm) is want
    assert type(model.layers[0].attention_norm) is {"rmsnorm": RMSNorm, "layernorm": LayerNorm}[block]
    if qk != "none":
        assert att.q_norm.eps == 1e-3 and att.q_norm.bias is None and att.q_norm.weight.shape == (8,)
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


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm", "dyt"])
def test_the_old_boolean_qk_norm_builds_what_it_built(tmp_path, norm):
    """A config.yaml written before qk_norm was a choice (`qk_norm: true` / `false`) loads, keeps its value as written
    (a study's arms still match its runs) and builds the block norm per head / none: the same model, bit for bit,
    as the name spelled out (for layernorm blocks with norm_bias, the qk-norms keep their bias as they did)."""
    bias = ["model.norm_bias=true"] if norm == "layernorm" else []
    for old, new in ((True, norm), (False, "none")):
        path = tmp_path / "config.yaml"
        text = to_yaml(load_config(None, [f"model.norm={norm}", *bias]))
        path.write_text(text.replace("qk_norm: none", f"qk_norm: {str(old).lower()}"))
        cfg = load_config(path)
        assert cfg.model.qk_norm is old and cfg.model.qk_norm_kind == new
        torch.manual_seed(0)
        a = Llama(cfg.model)
        if new == "dyt":  # not a qk_norm name of its own: only the old spelling builds it (DyT's attention alpha0)
            assert type(a.layers[0].attention.q_norm).__name__ == "DyT"
            continue
        torch.manual_seed(0)
        b = Llama(load_config(None, [f"model.norm={norm}", *bias, f"model.qk_norm={new}"]).model)
        assert a.state_dict().keys() == b.state_dict().keys()
        idx = torch.randint(0, 64, (2, 16))
        assert torch.equal(a(idx)[0], b(idx)[0])
        if norm == "layernorm" and old:
            assert a.layers[0].attention.q_norm.bias is not None


def test_a_bad_qk_norm_or_softcap_is_one_line():
    with pytest.raises(ConfigError, match="unknown qk_norm 'lay'; valid: layernorm, none, rmsnorm"):
        load_config(None, ["model.qk_norm=lay"])
    with pytest.raises(ConfigError, match="model.attn_softcap must be >= 0"):
        load_config(None, ["model.attn_softcap=-1"])
    with pytest.raises(ConfigError, match="model.qk_norm_eps must be > 0"):
        load_config(None, ["model.qk_norm_eps=0"])


# -- soft-capping -----------------------------------------------------------------------------------------------------
def _reference_attention(q, k, v, cap: float) -> torch.Tensor:
    """Causal attention written out per query in float64: z_ij = q_i.k_j / sqrt(d), cap tanh(z / cap), softmax over
    j <= i, sum_j a_ij v_j; kv head g serves query heads g * H / kv ...."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, T, hd = q.shape
    out = torch.zeros(B, H, T, hd, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // (H // k.shape[1])
            for i in range(T):
                z = k[b, g, :i + 1] @ q[b, h, i] / math.sqrt(hd)
                if cap:
                    z = cap * torch.tanh(z / cap)
                a = torch.exp(z - z.max())
                out[b, h, i] = (a / a.sum()) @ v[b, g, :i + 1]
    return out


@pytest.mark.parametrize("cap", [0.0, 2.0, 30.0])
def test_explicit_attention_with_a_softcap_matches_a_float64_reference(cap):
    """Logits up to ~15 in magnitude: a cap of 2 changes them a lot, 30 a little, 0 not at; float32 within 1e-5."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8) * 2, torch.randn(2, 2, 6, 8) * 2, torch.randn(2, 2, 6, 8)
    y = explicit_attention(q, k, v, cap)
    torch.testing.assert_close(y.double(), _reference_attention(q, k, v, cap), rtol=1e-5, atol=1e-5)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))  # and its gradients are the formula's
    assert torch.autograd.gradcheck(lambda a, b, c: explicit_attention(a, b, c, cap), (q64, k64, v64))


def test_explicit_attention_equals_sdpa_with_the_cap_off():
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 4, 9, 8), torch.randn(3, 2, 9, 8), torch.randn(3, 2, 9, 8)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        a, b, c = (t.to(dtype) for t in (q, k, v))
        sdpa = F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(explicit_attention(a, b, c, 0.0), sdpa, rtol=tol, atol=tol)


def test_a_model_with_a_cap_far_above_its_logits_equals_the_sdpa_model():
    """The forward dispatch: attn_softcap > 0 runs the explicit path; a cap of 1e6 changes logits of size ~1 by
    ~1e-12, so the two models' outputs agree to float32 noise."""
    torch.manual_seed(0)
    a = Llama(tiny_args())
    torch.manual_seed(0)
    b = Llama(tiny_args(attn_softcap=1e6))
    idx = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(b(idx)[0], a(idx)[0], rtol=1e-5, atol=1e-6)
    assert attention_path(b.args).startswith("explicit") and "scaled_dot_product_attention" in attention_path(a.args)


def test_output_softcap_matches_a_float64_reference():
    """logits = c tanh(raw / c) with raw the head's output, and the loss is the cross-entropy of the capped logits:
    logsumexp - the target's logit, per position, in float64."""
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


# -- attention entropy ------------------------------------------------------------------------------------------------
def _reference_entropy(q, k, cap: float) -> float:
    """Mean over batch, heads and query positions of -sum_j a_ij log a_ij, a_i the causal softmax, in float64."""
    q, k = q.double(), k.double()
    B, H, T, hd = q.shape
    total = 0.0
    for b in range(B):
        for h in range(H):
            g = h // (H // k.shape[1])
            for i in range(T):
                z = k[b, g, :i + 1] @ q[b, h, i] / math.sqrt(hd)
                z = cap * torch.tanh(z / cap) if cap else z
                logp = z - torch.logsumexp(z, 0)
                total -= (logp.exp() * logp).sum().item()
    return total / (B * H * T)


@pytest.mark.parametrize("cap", [0.0, 3.0])
def test_attention_entropy_matches_a_float64_reference(monkeypatch, cap):
    """Constructed q and k: heads from near-uniform (small q) to near one-hot (a large q), entropy in nats; the
    chunked pass (MAX_SCORES forcing one sequence at a time) gives the same numbers; logit_max stays the uncapped
    max |q.k| / sqrt(d)."""
    torch.manual_seed(0)
    q = torch.randn(3, 4, 7, 8) * torch.tensor([0.01, 1.0, 3.0, 30.0]).view(1, 4, 1, 1)
    k = torch.randn(3, 2, 7, 8)
    logit_max, entropy = metrics.qk_stats(q, k, cap)
    assert entropy.item() == pytest.approx(_reference_entropy(q, k, cap), rel=1e-5)
    uniform = sum(math.log(i + 1) for i in range(7)) / 7  # the entropy's ceiling: every key alike
    assert 0 < entropy.item() < uniform
    kk = k.double().repeat_interleave(2, dim=1)
    scores = (q.double() @ kk.transpose(-1, -2)).abs() / math.sqrt(8)
    assert logit_max.item() == pytest.approx(scores[..., torch.ones(7, 7).tril().bool()].max().item(), rel=1e-6)
    monkeypatch.setattr(metrics, "MAX_SCORES", 1)  # one sequence per chunk
    chunked = metrics.qk_stats(q, k, cap)
    assert chunked[0].item() == pytest.approx(logit_max.item(), rel=1e-6)
    assert chunked[1].item() == pytest.approx(entropy.item(), rel=1e-6)
    assert metrics.qk_stats(q * 0, k)[1].item() == pytest.approx(uniform, rel=1e-6)  # zero logits: uniform


def test_the_probe_logs_each_layers_attention_entropy_from_its_input():
    """attn/entropy/layer_{i} is the entropy of layer i's attention on this step's input (qk_stats of attention.qk),
    averaged over forward passes; with a softcap, of the capped logits the layer uses."""
    torch.manual_seed(0)
    model = Llama(tiny_args(attn_softcap=2.0, init_std=0.2))
    x = torch.randint(0, 64, (2, 3, 16))
    inputs = {}
    handles = [b.attention.register_forward_pre_hook(lambda m, a, i=i: inputs.setdefault(i, []).append(a))
               for i, b in enumerate(model.layers)]
    probe = metrics.StabilityProbe(model)
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
