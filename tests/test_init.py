"""Init switches (residual scaling, embedding std) and lab/analyses/init_grads.py at toy size."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import Llama, ModelArgs
from model.blocks import BLOCKS

REPO = Path(__file__).resolve().parent.parent


def _std(t: torch.Tensor) -> float:
    return t.float().std().item()


def test_residual_scaling_and_embedding_std():
    base = dict(dim=128, n_layers=8, n_heads=4, vocab_size=512, max_seq_len=16, init_std=0.02)
    torch.manual_seed(0)
    scaled = Llama(ModelArgs(**base))
    torch.manual_seed(0)
    plain = Llama(ModelArgs(**base, init_residual="plain", init_embedding_std=1.0))
    wo_scaled, wo_plain = (
        _std(scaled.layers[3].attention.wo.weight),
        _std(plain.layers[3].attention.wo.weight),
    )
    assert wo_scaled == pytest.approx(0.02 / math.sqrt(16), rel=0.05) and wo_plain == pytest.approx(
        0.02, rel=0.05
    )
    assert _std(plain.layers[3].attention.wq.weight) == pytest.approx(0.02, rel=0.05)
    assert _std(plain.tok_embeddings.weight) == pytest.approx(1.0, rel=0.05)
    assert _std(scaled.tok_embeddings.weight) == pytest.approx(0.02, rel=0.05)
    with pytest.raises(ValueError, match="unknown init_residual 'xavier'; valid: plain, scaled"):
        ModelArgs(**base, init_residual="xavier").check()


@pytest.mark.parametrize("dim", [64, 256])
def test_width_init_scale_draws_c_over_sqrt_d_everywhere_the_std_defaults_to_init_std(dim):
    """init_scale=width: init_std = 0.02 is the std at d = 4096, so at d every default std is c /
    sqrt(d) with c = 0.02 x sqrt(4096) = 1.28 (0.16 at d = 64, 0.08 at d = 256): the embedding,
    every matrix, the head; the residual projections divided by sqrt(2 n_layers) on top. A std from
    n draws has relative sd 1 / sqrt(2n): <= 1.6% here (n >= 2048), so 5% is > 3 sd."""
    c = 0.02 * math.sqrt(4096)
    base = dict(dim=dim, n_layers=4, n_heads=4, vocab_size=512, max_seq_len=16, init_scale="width")
    torch.manual_seed(0)
    m = Llama(ModelArgs(**base))
    want = c / math.sqrt(dim)
    assert m.args.matrix_std == pytest.approx(want, rel=1e-12)
    for name, t, std in [
        ("embedding", m.tok_embeddings.weight, want),
        ("wq", m.layers[2].attention.wq.weight, want),
        ("w1", m.layers[2].feed_forward.w1.weight, want),
        ("head", m.output.weight, want),
        ("wo", m.layers[2].attention.wo.weight, want / math.sqrt(8)),
        ("w2", m.layers[2].feed_forward.w2.weight, want / math.sqrt(8)),
    ]:
        assert _std(t) == pytest.approx(std, rel=0.05), name
    # explicit stds are absolute under either scale; the head's own std
    torch.manual_seed(0)
    m = Llama(ModelArgs(**base, init_embedding_std=1.0, init_head_std=0.3))
    assert _std(m.tok_embeddings.weight) == pytest.approx(1.0, rel=0.05)
    assert _std(m.output.weight) == pytest.approx(0.3, rel=0.05)
    assert _std(m.layers[0].attention.wq.weight) == pytest.approx(want, rel=0.05)
    # DeepNorm's beta multiplies the width-scaled std as it multiplies init_std
    torch.manual_seed(0)
    m = Llama(ModelArgs(**base, placement="deepnorm", norm="layernorm"))
    assert _std(m.layers[1].attention.wv.weight) == pytest.approx(want * (8 * 4) ** -0.25, rel=0.05)
    assert _std(m.layers[1].attention.wq.weight) == pytest.approx(want, rel=0.05)


def test_init_head_std_alone_and_the_reference_width_and_bad_values():
    base = dict(dim=64, n_layers=2, n_heads=4, vocab_size=1024, max_seq_len=16)
    torch.manual_seed(0)
    plain = Llama(ModelArgs(**base))
    torch.manual_seed(0)
    head = Llama(ModelArgs(**base, init_head_std=0.16))
    assert _std(head.output.weight) == pytest.approx(0.16, rel=0.05)
    # only the head changes: the same draws, scaled by 0.16 / 0.02 = 8
    torch.testing.assert_close(head.output.weight, plain.output.weight * 8, rtol=1e-6, atol=0)
    for (name, p), q in zip(plain.named_parameters(), head.parameters(), strict=True):
        if name != "output.weight":
            assert torch.equal(p, q), name
    # d = 4096 is where both scales agree; absolute leaves init_std as written at every width
    assert ModelArgs(dim=4096, init_scale="width").matrix_std == 0.02
    assert ModelArgs(dim=64, init_scale="absolute").matrix_std == 0.02
    assert (
        ModelArgs(dim=64, init_scale="width").head_std
        == ModelArgs(dim=64, init_scale="width").embedding_std
        == 0.16
    )
    with pytest.raises(ValueError, match="unknown init_scale 'xavier'; valid: absolute, width"):
        ModelArgs(**base, init_scale="xavier").check()
    with pytest.raises(ValueError, match="model.init_head_std must be >= 0 or null, got -1"):
        ModelArgs(**base, init_head_std=-1).check()
    with pytest.raises(ValueError, match="init_head_std needs an untied head"):
        ModelArgs(**base, init_head_std=0.1, tie_embeddings=True).check()


def _init_grads():
    from lab.analyses import init_grads

    return init_grads


@pytest.mark.slow
def test_init_grads_script_writes_sentences_with_n_and_ci(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "lab/analyses/init_grads.py",
            "--depths",
            "2",
            "3",
            "--dim",
            "16",
            "--batch",
            "2",
            "--seq",
            "8",
            "--seeds",
            "0",
            "1",
            "2",
            "--jvp-dirs",
            "2",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    ig = _init_grads()
    arms = len(BLOCKS) * 2 + 1
    assert set(ig.SETTINGS) == {
        "default",
        "xiong-swiglu",
        "xiong-relu",
        "xiong-gelu",
        "xiong-relu2",
    }
    rows = [
        line
        for line in r.stdout.splitlines()
        if line.startswith(tuple(f"| {s} |" for s in ig.SETTINGS))
    ]
    assert len(rows) == len(ig.SETTINGS) * arms * 2  # settings x arms x depths
    for name in ("init_grads.png", "init_grads_w2.png", "jacobian_gain.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runs"] == len(ig.SETTINGS) * arms * 2 * 3 and "claims" not in report
    ablation = len(ig.ABLATION_ARMS)
    # W2, all matrices, gain; FFN ablation
    assert len(report["findings"]) == len(ig.SETTINGS) * 3 + ablation
    for i, sentence in enumerate(report["findings"]):
        clauses = sentence.split("; ")
        assert len(clauses) == (
            arms if i < len(ig.SETTINGS) * 3 else len(ig.FFNS) + len(ig.PAIRED_FFNS)
        )
        for c in clauses:  # every verdict carries its CI and n (or says why it has none)
            assert ("95% CI" in c and "n = 3)" in c) or "not finite in" in c, c
    for t in report["layer_slopes"]:  # each verdict is the one its CI decides
        if t["ci"]:
            lo, hi = t["ci"]
            assert t["verdict"] == ("rises" if lo > 0 else "falls" if hi < 0 else "flat")
    for d in report["ffn_ablation"]:
        if d["ci"]:
            lo, hi = d["ci"]
            assert d["verdict"] == ("differs" if lo > 0 or hi < 0 else "no difference shown")
    assert len(report["ffn_ablation"]) == ablation * len(ig.PAIRED_FFNS)
    assert {(g["setting"], g["depth"]) for g in report["gains"]} == {(s, 3) for s in ig.SETTINGS}
    md = (tmp_path / "report.md").read_text()
    assert all(f"- {s}" in md for s in report["findings"])


def test_log_slope_recovers_an_exact_exponential():
    ig = _init_grads()
    ys = [3.0 * math.exp(-0.2 * layer) for layer in range(1, 9)]
    assert ig.log_slope(ys) == pytest.approx(-0.2, rel=1e-12)


def test_trend_is_the_mean_slope_with_a_t_interval_that_decides_the_verdict():
    ig = _init_grads()
    t975_2 = 4.302652729911275  # t quantile, 2 degrees of freedom (tables)

    def seeds(slopes):
        return [[math.exp(b * layer) for layer in range(1, 6)] for b in slopes]

    t = ig.trend(seeds([0.1, 0.2, 0.3]))  # mean 0.2, sd 0.1
    half = t975_2 * 0.1 / math.sqrt(3)
    assert t["slope"] == pytest.approx(0.2) and t["ci"] == pytest.approx((0.2 - half, 0.2 + half))
    assert t["verdict"] == "flat" and t["n"] == 3  # the CI (-0.048..0.448) contains 0
    assert ig.trend(seeds([0.19, 0.2, 0.21]))["verdict"] == "rises"
    assert ig.trend(seeds([-0.19, -0.2, -0.21]))["verdict"] == "falls"
    assert ig.trend(seeds([0.2]))["verdict"] == "no CI"
    bad = ig.trend(seeds([0.1, 0.2]) + [[1.0, float("nan"), 2.0, 1.0, 1.0]])
    assert bad["verdict"] == "not finite" and bad["not_finite"] == 1 and bad["slope"] is None
    assert "n = 3" in ig.slope_text(t) and "95% CI -0.0484..+0.448" in ig.slope_text(t)


def test_trend_interval_covers_the_true_slope_at_its_level():
    ig = _init_grads()
    gen = torch.Generator().manual_seed(0)
    covered, trials = 0, 400
    # 10 seeds, each a true slope 0.05 + seed effect, per-layer noise on the logs
    for _ in range(trials):
        curves = []
        for _ in range(10):
            b = 0.05 + 0.02 * torch.randn((), generator=gen).item()
            noise = 0.1 * torch.randn(12, generator=gen)
            curves.append([math.exp(b * layer + noise[layer - 1].item()) for layer in range(1, 13)])
        lo, hi = ig.trend(curves)["ci"]
        covered += lo <= 0.05 <= hi
    assert 0.92 <= covered / trials <= 0.98  # 95% nominal; binomial sd over 400 trials ~1.1%


def test_jacobian_gain_of_an_identity_block_is_one():
    ig = _init_grads()
    torch.manual_seed(0)
    model = Llama(
        ModelArgs(
            dim=16,
            n_layers=1,
            n_heads=4,
            n_kv_heads=2,
            vocab_size=32,
            max_seq_len=8,
            norm_impl="reference",
            ops_impl="reference",
        )
    )  # JVP: torch ops
    block = model.layers[0]
    with torch.no_grad():  # no residual branch output: h = x + 0 + 0
        block.attention.wo.weight.zero_()
        block.feed_forward.w2.weight.zero_()
    rope = (model.rope_cos, model.rope_sin)
    x = torch.randn(2, 8, 16)
    assert ig.jacobian_gain(lambda h: block(h, rope), x, 3) == pytest.approx(1.0, abs=1e-6)


def test_jacobian_gain_of_a_linear_map_is_its_rms_singular_value():
    ig = _init_grads()
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(64, 64, generator=gen))
    w, _ = torch.linalg.qr(torch.randn(64, 64, generator=gen))
    x = torch.randn(64, generator=gen)
    # every sv 2.5
    assert ig.jacobian_gain(lambda h: 2.5 * (u @ h), x, 3, gen) == pytest.approx(2.5, rel=1e-5)
    s = torch.linspace(0.1, 3.0, 64)
    rms = s.square().mean().sqrt().item()
    assert ig.jacobian_gain(lambda h: u @ (s * (w.T @ h)), x, 2000, gen) == pytest.approx(
        rms, rel=0.02
    )


@pytest.mark.slow
def test_jacobian_gain_of_a_block_matches_its_full_jacobian():
    ig = _init_grads()
    torch.manual_seed(0)
    args = ModelArgs(
        dim=8,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=32,
        max_seq_len=3,
        placement="post",
        ffn="relu",
        init_std=8**-0.5,
        init_residual="plain",
        norm_impl="reference",
        ops_impl="reference",
    )
    model = Llama(args)
    rope = (model.rope_cos, model.rope_sin)
    x = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(1))
    f = lambda h: model.layers[1](h, rope)  # noqa: E731
    # reverse mode, the flash kernel's backward
    jac = torch.autograd.functional.jacobian(f, x).reshape(24, 24)
    expected = (jac.square().sum() / 24).sqrt().item()
    got = ig.jacobian_gain(f, x, 4000, torch.Generator().manual_seed(2))
    assert got == pytest.approx(expected, rel=0.03)


def test_relu_feed_forward_is_the_original_transformers():
    torch.manual_seed(0)
    model = Llama(ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=64, ffn="relu"))
    ff = model.layers[0].feed_forward
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(ff(x), torch.relu(x @ ff.w1.weight.T) @ ff.w2.weight.T)
    assert not hasattr(ff, "w3")
    with pytest.raises(ValueError, match="unknown ffn 'geglu'; valid: gelu, relu, relu2, swiglu"):
        Llama(ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=64, ffn="geglu"))


@pytest.mark.parametrize(
    "ffn, act",
    [
        ("gelu", lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))),  # a * Phi(a), by hand
        ("relu2", lambda a: torch.where(a > 0, a * a, torch.zeros_like(a))),
    ],
)
def test_gelu_and_relu2_feed_forwards_match_their_formulas_with_relus_weights(ffn, act):
    def model(name):
        torch.manual_seed(0)
        return Llama(ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=64, ffn=name))

    ff, relu = model(ffn).layers[0].feed_forward, model("relu").layers[0].feed_forward
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(ff(x), act(x @ ff.w1.weight.T) @ ff.w2.weight.T)
    assert {k: v.shape for k, v in ff.state_dict().items()} == {
        k: v.shape for k, v in relu.state_dict().items()
    }
    for k, v in ff.state_dict().items():  # the same init: the same draws for the same seed
        torch.testing.assert_close(v, relu.state_dict()[k])
