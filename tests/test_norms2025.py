"""The 2025-26 norms, placements and attention controls (issue 43), each against its formula
written here in float64: LayerNorm Scaling, Mix-LN, HybridNorm, OLMo 2's whole-width qk-norm and
gated attention (Derf: tests/test_norms.py)."""

import math

import pytest
import torch

from model.args import ModelArgs
from model.llama import Llama

ARGS = dict(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16)
EPS = 1e-5
TOL = dict(rtol=1e-6, atol=1e-7)  # RoPE rotates in float32 whatever the model's dtype (layers.py)


def _model(**kw) -> Llama:
    torch.manual_seed(0)
    model = Llama(ModelArgs(**{**ARGS, **kw})).double()
    with torch.no_grad():  # gains and biases away from 1 and 0, so a missed one shows
        for name, p in model.named_parameters():
            if p.dim() == 1 and name != "embed_scale":
                p.add_(torch.randn_like(p) * 0.3)
    return model


def _rms(x, g, eps=EPS):
    """RMSNorm over the last dim, written out."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g


def _rotate(x, theta=10000.0):
    """RoPE on (B, T, H, hd) in Meta's interleaved layout, pair by pair."""
    T, hd = x.shape[1], x.shape[3]
    out = x.clone()
    for t in range(T):
        for i in range(hd // 2):
            a = t * theta ** (-2 * i / hd)
            c, s = math.cos(a), math.sin(a)
            x0, x1 = x[:, t, :, 2 * i], x[:, t, :, 2 * i + 1]
            out[:, t, :, 2 * i], out[:, t, :, 2 * i + 1] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


def _attention(att, x, q_norm=None, k_norm=None, v_norm=None, full=None, gate=None):
    """Causal grouped-query attention written out from the module's weights: q_norm / k_norm /
    v_norm per head (callables on (..., hd)), or `full` (q_norm, k_norm) over the whole width."""
    B, T, _ = x.shape
    H, KV, hd = att.n_heads, att.n_kv_heads, att.head_dim
    q, k, v = x @ att.wq.weight.T, x @ att.wk.weight.T, x @ att.wv.weight.T
    if full:
        q, k = full[0](q), full[1](k)
    q, k, v = q.view(B, T, H, hd), k.view(B, T, KV, hd), v.view(B, T, KV, hd)
    q = q_norm(q) if q_norm else q
    k = k_norm(k) if k_norm else k
    v = v_norm(v) if v_norm else v
    q, k = _rotate(q), _rotate(k)
    out = torch.zeros(B, T, H, hd, dtype=x.dtype)
    for h in range(H):
        g = h // (H // KV)
        scores = torch.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        w = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        out[:, :, h] = torch.einsum("bts,bsd->btd", w, v[:, :, g])
    if gate is not None:
        out = out * torch.sigmoid(x @ gate.T).view(B, T, H, -1)
    return out.reshape(B, T, H * hd) @ att.wo.weight.T


def _ffn(ff, x):
    return (torch.nn.functional.silu(x @ ff.w1.weight.T) * (x @ ff.w3.weight.T)) @ ff.w2.weight.T


def _rope(model, T):
    return (model.rope_cos[:T], model.rope_sin[:T])


def test_layernorm_scaling_scales_each_norm_output_by_one_over_sqrt_of_its_layer():
    """Sun et al. 2025 (Eq. 12): h = x + attn(norm(x) / sqrt(l)), out = h + ffn(norm(h) / sqrt(l)),
    l = 1..L; the final norm unscaled."""
    model = _model(placement="lns")
    x = torch.randn(2, 6, 32, dtype=torch.float64) * 2
    for i, block in enumerate(model.layers):
        n1, n2 = block.attention_norm, block.ffn_norm
        h = x + _attention(block.attention, _rms(x, n1.weight) / math.sqrt(i + 1))
        want = h + _ffn(block.feed_forward, _rms(h, n2.weight) / math.sqrt(i + 1))
        torch.testing.assert_close(block(x, _rope(model, 6)), want, **TOL)
    assert type(model.norm).__name__ == "RMSNorm"


@pytest.mark.parametrize("alpha,posts", [(0.25, 1), (0.5, 2), (0.0, 0), (1.0, 4)])
def test_mix_ln_is_post_norm_in_the_first_round_alpha_l_layers_and_pre_norm_after(alpha, posts):
    """Li et al. 2025: Post-LN in the first round(alpha L) layers, Pre-LN after; the final norm."""
    model = _model(placement="mixln", mix_ln_alpha=alpha)
    x = torch.randn(2, 6, 32, dtype=torch.float64) * 2
    for i, block in enumerate(model.layers):
        n1, n2, att, ff = block.attention_norm, block.ffn_norm, block.attention, block.feed_forward
        if i < posts:
            h = _rms(x + _attention(att, x), n1.weight)
            want = _rms(h + _ffn(ff, h), n2.weight)
        else:
            h = x + _attention(att, _rms(x, n1.weight))
            want = h + _ffn(ff, _rms(h, n2.weight))
        torch.testing.assert_close(block(x, _rope(model, 6)), want, **TOL)
    assert type(model.norm).__name__ == "RMSNorm"
    with pytest.raises(ValueError, match=r"model.mix_ln_alpha must be in \[0, 1\], got 1.5"):
        ModelArgs(**ARGS, mix_ln_alpha=1.5).check()


def test_hybridnorm_normalizes_q_k_v_per_head_and_post_norms_the_feed_forward():
    """Zhuo et al. 2025 (its OLMo config: attn_norm false, q/k/v norms per head, ffn_norm with
    ffn_residual_after_norm): h = x + attn_qkv(x); n = norm(h); out = n + ffn(n)."""
    model = _model(placement="hybrid")
    x = torch.randn(2, 6, 32, dtype=torch.float64) * 2
    for block in model.layers:
        att = block.attention
        assert not list(block.attention_norm.parameters())  # no norm before attention
        h = x + _attention(
            att,
            x,
            q_norm=lambda t, a=att: _rms(t, a.q_norm.weight),
            k_norm=lambda t, a=att: _rms(t, a.k_norm.weight),
            v_norm=lambda t, a=att: _rms(t, a.v_norm.weight),
        )
        n = _rms(h, block.ffn_norm.weight)
        want = n + _ffn(block.feed_forward, n)
        torch.testing.assert_close(block(x, _rope(model, 6)), want, **TOL)
    layer = model.layers[0].attention
    assert layer.q_norm.weight.shape == layer.v_norm.weight.shape == (8,)  # the head dim
    with pytest.raises(ValueError, match="placement=hybrid normalizes q, k and v .* got rmsnorm"):
        ModelArgs(**ARGS, placement="hybrid", qk_norm="rmsnorm").check()
    ln = _model(placement="hybrid", norm="layernorm")  # the block norm's own class
    assert type(ln.layers[0].attention.v_norm).__name__ == "LayerNorm"


def test_hybridnorm_star_makes_the_first_block_pre_norm_and_keeps_its_qkv_norms():
    """HybridNorm* (its README's override of block 0: attn_norm on, ffn_residual off): block 0 is
    h = x + attn_qkv(norm(x)); out = h + ffn(norm(h)); blocks 1.. are HybridNorm's."""
    model = _model(placement="hybridstar")
    x = torch.randn(2, 6, 32, dtype=torch.float64) * 2
    for block in model.layers:
        att = block.attention
        qkv = dict(
            q_norm=lambda t, a=att: _rms(t, a.q_norm.weight),
            k_norm=lambda t, a=att: _rms(t, a.k_norm.weight),
            v_norm=lambda t, a=att: _rms(t, a.v_norm.weight),
        )
        if block.layer_id == 0:
            h = x + _attention(att, _rms(x, block.attention_norm.weight), **qkv)
            want = h + _ffn(block.feed_forward, _rms(h, block.ffn_norm.weight))
        else:
            assert not list(block.attention_norm.parameters())
            n = _rms(x + _attention(att, x, **qkv), block.ffn_norm.weight)
            want = n + _ffn(block.feed_forward, n)
        torch.testing.assert_close(block(x, _rope(model, 6)), want, **TOL)
    with pytest.raises(ValueError, match="placement=hybridstar normalizes q, k and v .* got olmo2"):
        ModelArgs(**ARGS, placement="hybridstar", qk_norm="olmo2").check()


def test_olmo2_qk_norm_is_one_rmsnorm_over_q_and_k_whole_width_before_the_head_split():
    model = _model(qk_norm="olmo2")
    att = model.layers[0].attention
    assert att.q_norm.weight.shape == (32,) and att.k_norm.weight.shape == (16,)  # H hd, KV hd
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    full = (lambda t: _rms(t, att.q_norm.weight), lambda t: _rms(t, att.k_norm.weight))
    torch.testing.assert_close(att(x, _rope(model, 6)), _attention(att, x, full=full), **TOL)
    per_head = _model(qk_norm="rmsnorm").layers[0].attention
    assert per_head.q_norm.weight.shape == (8,)


@pytest.mark.parametrize("kind,width", [("elementwise", 32), ("headwise", 4)])
def test_gated_attention_multiplies_each_head_by_a_sigmoid_of_its_input(kind, width):
    """Qiu et al. 2025 (G1): y_h * sigmoid(x W_g) before wo, per unit or per head; the gate is
    drawn after every other weight, so the rest of the model is the ungated one's."""
    model = _model(attn_gate=kind)
    att = model.layers[1].attention
    assert att.w_gate.weight.shape == (width, 32)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    want = _attention(att, x, gate=att.w_gate.weight)
    torch.testing.assert_close(att(x, _rope(model, 6)), want, **TOL)
    torch.manual_seed(3)
    plain = Llama(ModelArgs(**ARGS))
    torch.manual_seed(3)
    gated = dict(Llama(ModelArgs(**ARGS, attn_gate=kind)).named_parameters())
    for name, p in plain.named_parameters():
        assert torch.equal(gated[name], p), name
    with pytest.raises(ValueError, match="unknown attn_gate 'sigmoid'; valid: elementwise"):
        ModelArgs(**ARGS, attn_gate="sigmoid").check()


@pytest.mark.parametrize("placement", ["lns", "mixln", "hybrid", "hybridstar"])
def test_new_placements_start_from_the_same_matrices_as_pre_norm(placement):
    torch.manual_seed(7)
    ref = {k: v for k, v in Llama(ModelArgs(**ARGS)).state_dict().items() if v.dim() >= 2}
    torch.manual_seed(7)
    other = Llama(ModelArgs(**ARGS, placement=placement)).state_dict()
    for k, v in ref.items():
        assert torch.equal(other[k], v), k


def test_olmo2_qk_norm_under_tensor_parallelism_is_refused_in_one_line():
    from training.config import ConfigError
    from training.parallel import check_layout

    args = ModelArgs(**ARGS, qk_norm="olmo2").check()
    with pytest.raises(ConfigError, match="qk_norm=olmo2 normalizes q and k over every head"):
        check_layout("tp", 2, 2, args, 16)
    check_layout("tp", 2, 2, ModelArgs(**ARGS, qk_norm="rmsnorm").check(), 16)  # per head: fine
