"""The decoder for every norm x placement: causality, initial loss, overfitting, init, generate."""

import math

import pytest
import torch
from conftest import tiny_args

from model import Llama
from model.blocks import BLOCKS
from model.norm_config import NORMS

NORM_NAMES = [
    n for n in NORMS if n != "none"
]  # every norm of the registry (none has its own tests)
PLACEMENTS = sorted(BLOCKS)


tiny = tiny_args


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_causal(norm, placement):
    torch.manual_seed(0)
    qk = "none" if placement.startswith("hybrid") else "rmsnorm"  # it has q/k/v norms of its own
    model = Llama(tiny(norm=norm, placement=placement, qk_norm=qk)).eval()
    idx = torch.randint(0, 64, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=1e-6)
    assert (a[:, 10:] - b[:, 10:]).abs().max() > 1e-4


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_initial_loss_is_near_uniform(norm, placement):
    torch.manual_seed(0)
    model = Llama(tiny(norm=norm, placement=placement, vocab_size=512, dim=64))
    idx = torch.randint(0, 512, (4, 16))
    _, loss = model(idx, idx)
    assert abs(loss.item() - math.log(512)) < 0.1


@pytest.mark.slow  # a training property, not the inner loop's
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_overfits_one_batch(norm, placement):
    """Every norm in every placement can memorize one batch of random targets: its loss gets below
    0.02 (from ln 64 = 4.16) within 300 steps, and the test stops there.

    Reaching, not ending: at lr 5e-3 and d = 64 AdamW's last values are chaotic across CPUs and
    code paths (pRMSNorm in peri ended at 1.69 on one machine and 3.52 on another at lr 1e-2), while
    the first step below the bound is not marginal: 23-164 steps for every pair here (a factor >
    1.8 below 300). DyT in the post placement (tanh of the summed stream) learns slowly and
    noisily, HybridNorm normalizes each head's q, k and v with the block norm (DyT learns as slowly
    there, and pRMSNorm estimates each head's RMS from ceil(0.0625 x 16) = 1 feature; HybridNorm*
    keeps those per-head norms): those four are held to half the initial loss, reached in 10-84
    steps."""
    torch.manual_seed(0)
    model = Llama(tiny(norm=norm, placement=placement, dim=64))
    x = torch.randint(0, 64, (4, 16))
    y = torch.randint(0, 64, (4, 16))  # random targets: only memorization can lower the loss
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    first = model(x, y)[1].item()
    assert first == pytest.approx(math.log(64), abs=0.1)
    weak = (("dyt", "post"), ("dyt", "hybrid"), ("prmsnorm", "hybrid"), ("prmsnorm", "hybridstar"))
    bound = first / 2 if (norm, placement) in weak else 0.02
    seen = []
    while len(seen) < 300 and (not seen or seen[-1] >= bound):
        opt.zero_grad()
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        seen.append(loss.item())
    assert seen[-1] < bound, f"{norm}/{placement}: {min(seen):.3g} at best in 300 steps"


def test_same_seed_same_weights_whatever_the_norm():
    states = {}
    for norm, placement in [
        ("rmsnorm", "pre"),
        ("layernorm", "pre"),
        ("layernorm", "post"),
        ("none", "peri"),
    ]:
        torch.manual_seed(123)
        model = Llama(tiny(norm=norm, placement=placement, qk_norm="layernorm"))
        states[norm, placement] = {k: v for k, v in model.state_dict().items() if v.dim() >= 2}
    ref = states["rmsnorm", "pre"]
    for state in states.values():
        assert state.keys() == ref.keys()
        for k in ref:
            assert torch.equal(state[k], ref[k]), k


def test_init_scales_residual_projections():
    torch.manual_seed(0)
    model = Llama(tiny(dim=256, n_layers=8, n_heads=4, n_kv_heads=4, vocab_size=1000))
    std = lambda p: p.detach().std().item()
    assert abs(std(model.layers[0].attention.wq.weight) - 0.02) < 1e-3
    assert abs(std(model.layers[0].feed_forward.w2.weight) - 0.02 / 4) < 5e-4  # 1/sqrt(2 * 8)
    assert all(
        torch.equal(m.weight, torch.ones_like(m.weight))
        for m in [model.norm, model.layers[3].ffn_norm]
    )


def test_post_norm_has_no_final_norm_and_tied_embeddings_share_weights():
    assert not list(Llama(tiny(placement="post")).norm.parameters())
    tied = Llama(tiny(tie_embeddings=True))
    assert tied.output.weight is tied.tok_embeddings.weight
    assert tied.num_params() == Llama(tiny()).num_params() - 64 * 32
    # non-embedding (Kaplan et al. 2020's N): the blocks and norms, neither embedding nor head
    untied = Llama(tiny())
    blocks = sum(p.numel() for p in [*untied.layers.parameters(), *untied.norm.parameters()])
    assert untied.num_params(non_embedding=True) == blocks == tied.num_params(non_embedding=True)


def test_unknown_placement_and_bad_shapes():
    with pytest.raises(
        ValueError, match=f"unknown placement 'middle'; valid: {', '.join(PLACEMENTS)}"
    ):
        Llama(tiny(placement="middle"))
    with pytest.raises(ValueError, match="unknown norm"):
        Llama(tiny(norm="groupnorm"))
    with pytest.raises(ValueError, match="n_kv_heads"):
        Llama(tiny(n_kv_heads=3))
    for bad in (0, -1.0):  # before: a zero-width feed-forward built without an error
        with pytest.raises(ValueError, match="ffn_dim_multiplier must be positive"):
            Llama(tiny(ffn_dim_multiplier=bad))
    with pytest.raises(ValueError, match="norm rmsnorm: unknown option.s. bias; valid: none"):
        Llama(tiny(norm="rmsnorm", norm_options={"rmsnorm": {"bias": True}}))


def test_generate_greedy_is_deterministic_and_sampling_respects_top_k():
    torch.manual_seed(0)
    model = Llama(tiny()).eval()
    prompt = torch.randint(0, 64, (2, 4))
    out = model.generate(prompt, 20, temperature=0)
    assert out.shape == (2, 24) and torch.equal(out[:, :4], prompt)
    assert torch.equal(out, model.generate(prompt, 20, temperature=0))
    sampled = model.generate(prompt, 1, temperature=1.0, top_k=1)
    assert torch.equal(sampled, out[:, :5])  # top_k=1 sampling is greedy
