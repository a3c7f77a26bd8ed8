"""Our Llama against transformers' LlamaForCausalLM, the independent reference implementation."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import Llama, ModelArgs  # noqa: E402
from model.hf import from_hf, to_hf  # noqa: E402

ARGS = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, max_seq_len=32, rope_theta=500.0)


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
        vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, rope_theta=500.0,
        tie_word_embeddings=tie)
    theirs = transformers.LlamaForCausalLM(config).eval()
    _perturb_gains(theirs)
    ours = from_hf(theirs).eval()
    assert ours.args.n_kv_heads == 2 and ours.args.ffn_hidden_dim == 160 and ours.args.tie_embeddings == tie
    idx = torch.randint(0, 97, (3, 32))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], theirs(idx).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("change", [dict(norm="layernorm"), dict(placement="post"), dict(placement="peri"),
                                    dict(qk_norm=True)])
def test_inexpressible_configs_are_refused(change):
    model = Llama(ModelArgs(**{**ARGS, **change}))
    with pytest.raises(ValueError, match="LlamaForCausalLM cannot express model.(norm|placement|qk_norm)"):
        to_hf(model)
