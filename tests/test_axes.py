"""The study axes' switches: pRMSNorm, the norms' precision, the reordered (OLMo 2) and DeepNorm
placements, linear biases and a mean-shifted embedding, each against an independent computation."""

import math

import pytest
import torch
from torch import nn

from model.args import ModelArgs
from model.blocks import DeepNormBlock, PostNormBlock, ReorderedNormBlock
from model.llama import Llama, parameter_kinds
from model.norm_config import NormConfig
from model.norms import PRMSNorm, RMSNorm

ARGS = dict(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16)


def test_prmsnorm_is_the_rms_of_the_first_p_of_the_features_in_float64():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 64, dtype=torch.float64) * 3 + 0.5
    norm = PRMSNorm(64).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    k = math.ceil(0.0625 * 64)  # 4 features
    want = x / (x[..., :k].pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * norm.weight
    torch.testing.assert_close(norm(x), want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(norm, (x[:1, :2].clone().requires_grad_(),))


def test_prmsnorm_with_p_1_is_rmsnorm():
    x = torch.randn(4, 48)
    full = PRMSNorm(48)
    full.p = 1.0
    torch.testing.assert_close(full(x), RMSNorm(48)(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_autocast_precision_overflows_float16_where_the_float32_policy_does_not(name):
    x = torch.randn(4, 64)
    x[0] *= 400 / x[0].abs().max()  # one row reaching |x| = 400: x^2 = 160000 > float16's max 65504
    safe, naive = NormConfig(name).build(64), NormConfig(name, precision="autocast").build(64)
    want = NormConfig(name).build(64).double()(x.double())
    with torch.autocast("cpu", dtype=torch.float16):
        y_safe, y_naive = safe(x), naive(x)
    torch.testing.assert_close(y_safe.double(), want, rtol=1e-5, atol=1e-5)
    if name == "rmsnorm":  # mean(x^2) = inf -> rsqrt = 0: the whole row is wiped out
        assert y_naive[0].abs().max() == 0
    else:  # layernorm centres first; its variance overflows as well: a row of zeros or NaN
        assert not torch.isfinite(y_naive[0]).all() or y_naive[0].abs().max() == 0
    # float16 rounding only
    torch.testing.assert_close(y_naive[1:].double(), want[1:], rtol=2e-3, atol=2e-3)


def test_autocast_precision_in_bfloat16_is_the_formula_in_bfloat16():
    x = torch.randn(8, 64) * 3
    naive = NormConfig("rmsnorm", precision="autocast").build(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = naive(x)
    xb = x.bfloat16()
    torch.testing.assert_close(
        y, (xb * torch.rsqrt(xb.pow(2).mean(-1, keepdim=True) + 1e-5)).float(), rtol=0, atol=0
    )
    # bfloat16 rounding is visible...
    assert (y - NormConfig("rmsnorm").build(64)(x)).abs().max() > 0
    # ...and without autocast float32 input stays float32
    assert naive(x).equal(NormConfig("rmsnorm").build(64)(x))


def _block(cls, **kw):
    torch.manual_seed(0)
    return cls(ModelArgs(**{**ARGS, **kw}), 0)


def test_reordered_block_normalizes_the_sublayer_outputs_not_the_stream():
    block = _block(ReorderedNormBlock)
    model = Llama(ModelArgs(**ARGS, placement="reordered"))
    rope = (model.rope_cos[:8], model.rope_sin[:8])
    x = torch.randn(2, 8, 32) * 5
    h = x + block.attention_norm(block.attention(x, rope))
    torch.testing.assert_close(block(x, rope), h + block.ffn_norm(block.feed_forward(h)))
    assert model.norm.__class__.__name__ == "RMSNorm"  # OLMo 2 keeps the final norm


def test_deepnorm_scales_the_residual_by_alpha_and_its_init_by_beta():
    n = ARGS["n_layers"]
    deep, post = _block(DeepNormBlock), _block(PostNormBlock, init_residual="plain")
    deep.reset_parameters(0.02, n)
    torch.manual_seed(1)
    post.reset_parameters(0.02, n, "plain")
    torch.manual_seed(1)
    deep.reset_parameters(0.02, n)
    alpha, beta = (2 * n) ** 0.25, (8 * n) ** -0.25
    assert deep.alpha == pytest.approx(alpha)
    for name in ("attention.wq", "attention.wk"):  # the same draws, unscaled
        assert deep.get_submodule(name).weight.equal(post.get_submodule(name).weight)
    for name in (
        "attention.wv",
        "attention.wo",
        "feed_forward.w1",
        "feed_forward.w2",
        "feed_forward.w3",
    ):
        torch.testing.assert_close(
            deep.get_submodule(name).weight, post.get_submodule(name).weight * beta
        )
    model = Llama(ModelArgs(**ARGS, placement="deepnorm"))
    rope = (model.rope_cos[:8], model.rope_sin[:8])
    x = torch.randn(2, 8, 32)
    h = deep.attention_norm(alpha * x + deep.attention(x, rope))
    torch.testing.assert_close(deep(x, rope), deep.ffn_norm(alpha * h + deep.feed_forward(h)))


def test_linear_biases_start_at_zero_are_biases_and_enter_the_fused_qkv_matmul():
    torch.manual_seed(0)
    model = Llama(ModelArgs(**ARGS, linear_bias=True))
    kinds = parameter_kinds(model)
    biases = [n for n, k in kinds.items() if k == "bias"]
    assert len(biases) == 7 * ARGS["n_layers"]  # q, k, v, o, w1, w2, w3 per block
    assert all(model.get_parameter(n).abs().max() == 0 for n in biases)
    attn = model.layers[0].attention
    with torch.no_grad():
        for m in (attn.wq, attn.wk, attn.wv):
            m.bias.normal_()
    x = torch.randn(2, 8, 32)
    rope = (model.rope_cos[:8], model.rope_sin[:8])
    q, k, v = attn.project(x, rope)
    want_v = attn.wv(x).view(2, 8, 2, 8).transpose(1, 2)  # separate nn.Linear calls, bias included
    torch.testing.assert_close(v, want_v)
    from model.rope import apply_rope

    torch.testing.assert_close(q, apply_rope(attn.wq(x).view(2, 8, 4, 8), rope).transpose(1, 2))


def test_embedding_mean_shifts_every_token_and_nothing_else():
    torch.manual_seed(0)
    plain = Llama(ModelArgs(**ARGS))
    torch.manual_seed(0)
    shifted = Llama(ModelArgs(**ARGS, init_embedding_mean=0.1))
    torch.testing.assert_close(shifted.tok_embeddings.weight, plain.tok_embeddings.weight + 0.1)
    for (name, a), (_, b) in zip(plain.named_parameters(), shifted.named_parameters(), strict=True):
        if name != "tok_embeddings.weight":
            assert a.equal(b), name


def test_bad_norm_precision_lists_the_valid_ones():
    with pytest.raises(ValueError, match="autocast, float32"):
        Llama(ModelArgs(**ARGS, norm_precision="half"))
    with pytest.raises(ValueError, match="autocast, float32"):
        nn.Sequential(NormConfig("rmsnorm", precision="half").build(8))


def test_autocast_precision_in_float16_overflows_the_backward_of_rsqrt_for_small_inputs():
    """d rsqrt(m) = -r^3 / 2 with r = rsqrt(m): in float16 r^3 overflows once the input RMS is below
    65504^(-1/3) = 0.025 (the embedding's init std is 0.02), whatever the loss scale; the float32
    policy does not."""
    x = (torch.randn(4, 64) * 0.02).requires_grad_()
    for precision, finite in (("float32", True), ("autocast", False)):
        norm = NormConfig("rmsnorm", precision=precision).build(64)
        with torch.autocast("cpu", dtype=torch.float16):
            y = norm(x)
        (g,) = torch.autograd.grad(y.float().pow(2).sum() * 1e-3, x)
        assert bool(torch.isfinite(g).all()) is finite, precision
