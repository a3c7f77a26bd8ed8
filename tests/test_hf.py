"""Our Llama against transformers' LlamaForCausalLM, the independent reference implementation."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import Llama, ModelArgs  # noqa: E402
from model.hf import from_hf, to_hf  # noqa: E402

ARGS = dict(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, max_seq_len=32, rope_theta=500.0
)


def _perturb_gains(model: torch.nn.Module) -> None:
    for p in model.parameters():
        if p.dim() == 1:
            p.data.add_(torch.randn_like(p) * 0.2)


@pytest.mark.parametrize("tie", [False, True])
def test_ours_to_hf_same_logits(tie):
    torch.manual_seed(0)
    ours = Llama(ModelArgs(**ARGS, tie_embeddings=tie)).eval()
    _perturb_gains(ours)
    theirs = to_hf(ours).eval()
    idx = torch.randint(0, 97, (3, 32))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], theirs(idx).logits, rtol=0, atol=1e-5)
    assert sum(p.numel() for p in theirs.parameters()) == ours.num_params()


@pytest.mark.parametrize("tie", [False, True])
def test_hf_initialized_llama_to_ours_same_logits(tie):
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        tie_word_embeddings=tie,
    )
    theirs = transformers.LlamaForCausalLM(config).eval()
    _perturb_gains(theirs)
    ours = from_hf(theirs).eval()
    assert (
        ours.args.n_kv_heads == 2
        and ours.args.ffn_hidden_dim == 160
        and ours.args.tie_embeddings == tie
    )
    idx = torch.randint(0, 97, (3, 32))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], theirs(idx).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "change",
    [
        dict(norm="layernorm"),
        dict(placement="post"),
        dict(placement="peri"),
        dict(qk_norm="rmsnorm"),
        dict(qk_norm="layernorm"),
        dict(attn_softcap=50.0),
        dict(logit_softcap=30.0),
    ],
)
def test_inexpressible_configs_are_refused(change):
    model = Llama(ModelArgs(**{**ARGS, **change}))
    with pytest.raises(
        ValueError,
        match="LlamaForCausalLM cannot express "
        "model.(norm|placement|qk_norm|attn_softcap|logit_softcap)",
    ):
        to_hf(model)


HF_SMALL = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    rms_norm_eps=1e-6,
)


@pytest.mark.parametrize(
    "change,reason",
    [
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (
            dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
            "RoPE scaling",
        ),
        (
            dict(
                rope_scaling={
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32,
                }
            ),
            "RoPE scaling",
        ),
    ],
)
def test_from_hf_refuses_what_it_cannot_express(change, reason):
    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_SMALL, **change))
    with pytest.raises(ValueError, match=f"cannot express this LlamaConfig: .*{reason}"):
        from_hf(theirs)


def test_transformers_4x_config_form():
    """transformers 4.x keeps rope_theta apart and rope_scaling None by default ('type' in older
    files)."""
    from types import SimpleNamespace

    from model.hf import args_from_hf

    base = dict(
        HF_SMALL,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        head_dim=16,
        rope_theta=500.0,
        tie_word_embeddings=False,
        initializer_range=0.02,
    )
    assert args_from_hf(SimpleNamespace(**base, rope_scaling=None)).rope_theta == 500.0
    assert (
        args_from_hf(SimpleNamespace(**base, rope_scaling={"rope_type": "default"})).rope_theta
        == 500.0
    )
    for scaling in ({"type": "linear", "factor": 2.0}, {"rope_type": "llama3", "factor": 8.0}):
        with pytest.raises(ValueError, match="RoPE scaling"):
            args_from_hf(SimpleNamespace(**base, rope_scaling=scaling))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_run(dtype):
    """The RoPE tables stay float32 when the model is cast (torch.complex rejects bfloat16 /
    float16)."""
    torch.manual_seed(2)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_SMALL)).eval()
    idx = torch.randint(0, 97, (2, 32))
    with torch.no_grad():
        expected = theirs(idx).logits
        ours = from_hf(theirs.to(dtype)).eval()
        assert ours.rope_cos.dtype == torch.float32 and ours.tok_embeddings.weight.dtype == dtype
        torch.testing.assert_close(ours(idx)[0].float(), expected, rtol=0, atol=0.1)
        assert Llama(ModelArgs(**ARGS)).to(dtype)(idx)[0].dtype == dtype


def test_real_valued_rope_equals_the_complex_rotation():
    from model.rope import apply_rope, rope_tables

    x = torch.randn(2, 8, 4, 16, dtype=torch.float64)
    cos, sin = rope_tables(16, 8, 500.0)
    expected = torch.view_as_real(
        torch.view_as_complex(x.unflatten(-1, (-1, 2)))
        * torch.complex(cos.double(), sin.double())[:, None, :]
    ).flatten(-2)
    torch.testing.assert_close(apply_rope(x, (cos, sin)).double(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rope_is_the_pairwise_formula_bit_for_bit_forward_and_backward(dtype):
    """apply_rope works on whole heads (x cos + swap(x) sin); the pairwise formula (a cos - b sin, a
    sin + b cos, stacked back) gives the same bits, outputs and input gradients, on a strided slice
    as in the model."""
    from model.rope import apply_rope, rope_tables

    def pairwise(x, rope):
        cos, sin = (t.float()[:, None, :] for t in rope)
        a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)

    gen = torch.Generator().manual_seed(0)
    rope = rope_tables(16, 12, 10000.0)
    base = (torch.randn(3, 12, 128, generator=gen) * 3).to(dtype)
    g = torch.randn(3, 12, 4, 16, generator=gen).to(dtype)
    outs = []
    for fn in (apply_rope, pairwise):
        x = base.clone().requires_grad_()
        # a slice of a wider projection, as q and k are
        y = fn(x[..., 32:96].view(3, 12, 4, 16), rope)
        y.backward(g)
        outs.append((y, x.grad))
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
