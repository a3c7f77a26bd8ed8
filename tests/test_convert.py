"""LayerNorm -> RMSNorm, exactly (Jiang et al. 2023; model/convert.py, normlab/convert.py,
scripts/convert_norms.py):
the converted model's logits against the original's, in float64 and float32, for normlab models
and a transformers GPT-2; the refusals; the naive swap as the contrast; and the training-time
identity, model.zero_mean_writers."""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import Llama
from model.args import ModelArgs
from model.convert import refusal, swap_norms, to_rmsnorm
from model.norms import LayerNorm

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "train" / "tiny.yaml"


def _model(dtype=torch.float64, **kw) -> Llama:
    """A small pre-LN Llama with gains and biases away from 1 and 0 and a mean in its stream."""
    torch.manual_seed(0)
    args = dict(dim=32, n_layers=2, n_heads=4, vocab_size=64, norm="layernorm")
    model = Llama(ModelArgs(**{**args, "init_embedding_mean": 0.3, **kw})).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # gains, linear biases
                p.uniform_(0.5, 1.5)
    return model


def _max_diff(a, b, idx) -> tuple[float, float]:
    la, lb = a.eval()(idx)[0].double(), b.eval()(idx)[0].double()
    return (la - lb).abs().max().item(), la.abs().max().item()


CASES = {
    "pre": {},
    "tied head": {"tie_embeddings": True},
    "lns, biases, gate, qk-norm, relu": {
        "placement": "lns",
        "linear_bias": True,
        "attn_gate": "headwise",
        "qk_norm": "layernorm",
        "ffn": "relu",
    },
    "embed scale, soft-caps": {"embed_scale": "sqrt_dim", "logit_softcap": 30.0},
}


@pytest.mark.parametrize("case", CASES)
def test_the_converted_model_computes_the_same_logits(case):
    """float64: <= 1e-10 absolute. float32: the conversion's logits within 1e-5 of the largest
    |logit| of the exact (float64) ones; the float32 original is off by its own rounding as well
    (LayerNorm's centring cancels the stream's mean in float32), so the two float32 models differ
    by at most that plus 1e-5."""
    idx = torch.randint(0, 64, (3, 24), generator=torch.Generator().manual_seed(1))
    model = _model(torch.float32, **CASES[case])
    exact64 = to_rmsnorm(copy.deepcopy(model).double())
    assert exact64.args.norm == "rmsnorm" and not exact64.args.tie_embeddings
    widths = [m.normalized_shape for m in exact64.modules() if isinstance(m, LayerNorm)]
    assert (32,) not in widths  # qk-norms (head_dim 8) are not the stream's
    assert next(exact64.parameters()).dtype == torch.float64
    truth = copy.deepcopy(model).double().eval()(idx)[0]
    scale = truth.abs().max().item()
    assert (exact64.eval()(idx)[0] - truth).abs().max() <= 1e-10
    exact32 = to_rmsnorm(model)
    assert next(exact32.parameters()).dtype == torch.float32
    own = (model.eval()(idx)[0].double() - truth).abs().max().item()
    converted = (exact32.eval()(idx)[0].double() - truth).abs().max().item()
    assert converted <= 1e-5 * scale, converted / scale
    assert _max_diff(model, exact32, idx)[0] <= own + 1e-5 * scale


def test_the_naive_swap_computes_something_else_and_the_exact_one_not():
    """The contrast: with a mean in the stream, swapping LayerNorm for RMSNorm changes the logits by
    orders of magnitude more than the conversion's float error."""
    model = _model()
    naive = copy.deepcopy(model)
    assert swap_norms(naive, "rmsnorm") == 5  # 2 per layer + the final norm
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    assert (
        _max_diff(model, naive, idx)[0] > 1e-3 > 1e6 * _max_diff(model, to_rmsnorm(model), idx)[0]
    )


@pytest.mark.parametrize(
    "kw, why",
    [
        ({"placement": "post"}, "placement is 'post'"),
        ({"placement": "mixln"}, "placement is 'mixln'"),
        ({"placement": "peri"}, "placement is 'peri'"),
        ({"norm": "rmsnorm"}, "norm is 'rmsnorm'"),
        ({"norm_options": {"layernorm": {"bias": True}}}, "have a bias"),
    ],
)
def test_layouts_without_the_identity_are_refused_with_the_reason(kw, why):
    model = _model(**kw)
    assert why in refusal(model.args)
    with pytest.raises(ValueError) as e:
        to_rmsnorm(model)
    assert "no exact LayerNorm -> RMSNorm conversion" in str(e.value) and "\n" not in str(e.value)


def _figures(line: str) -> list[float]:
    """float64 difference, float32 difference, the float32 model's and conversion's errors."""
    pattern = r"float64 (\S+); float32 (\S+) of .* the model (\S+), its conversion (\S+)\)"
    return [float(x) for x in re.search(pattern, line).groups()]


def _run(*argv, cwd=ROOT):
    return subprocess.run(
        [sys.executable, *map(str, argv)], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_the_command_converts_a_run_that_samples_and_exports(tmp_path, data_args):
    """A trained pre-LN run -> a pre-RMSNorm run directory: the command reports its logit
    differences and the naive swap's val loss; the result loads (sample.py) with the same logits,
    and a post-norm run is refused in one line."""
    common = [f"--config={TINY}", f"log.out_dir={tmp_path}", "train.sample_tokens=0", *data_args]
    for placement in ("pre", "post"):
        done = _run(
            ROOT / "train.py",
            *common,
            "--norm",
            "layernorm",
            "--placement",
            placement,
            "--name",
            placement,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
    done = _run("-m", "scripts.convert_norms", tmp_path / "pre", tmp_path / "rms")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "5 LayerNorms -> RMSNorm" in lines[0]
    f64, f32, own, conv = _figures(lines[1])
    assert f64 <= 1e-10 and conv <= 1e-5 and f32 <= own + 1e-5
    assert "naive swap" in lines[2] and lines[-1].startswith(f"wrote {tmp_path / 'rms'}")
    from training.checkpoint import load_run

    a, prepared = load_run(tmp_path / "pre")
    b, _ = load_run(tmp_path / "rms")
    assert b.args.norm == "rmsnorm" and b.output.weight is not b.tok_embeddings.weight
    idx = torch.randint(0, a.args.vocab_size, (2, 16))
    diff, scale = _max_diff(a, b, idx)
    assert diff <= 1e-5 * scale
    sample = _run("-m", "scripts.sample", tmp_path / "rms", "--tokens", "5", cwd=tmp_path)
    assert sample.returncode == 0, sample.stderr
    post = _run("-m", "scripts.convert_norms", tmp_path / "post", tmp_path / "x")
    err = post.stderr.strip().splitlines()
    assert post.returncode == 2 and len(err) == 1 and "placement is 'post'" in err[0]
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_the_command_converts_a_transformers_gpt2(tmp_path):
    """A randomly initialised tiny GPT-2 (LayerNorms with gains and biases, a mean in wte) -> the
    same transformers module tree with torch RMSNorms, saved whole: reloaded, the same logits."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=60, n_positions=64)
    )
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.3)
        model.transformer.wte.weight.add_(0.2)
    model.save_pretrained(tmp_path / "gpt2")
    done = _run("-m", "scripts.convert_norms", "--hf", tmp_path / "gpt2", tmp_path / "g.pt")
    assert done.returncode == 0, done.stderr
    f64, f32, own, conv = _figures(done.stdout.splitlines()[1])
    assert f64 <= 1e-10 and conv <= 1e-5 and f32 <= own + 1e-5
    converted = torch.load(tmp_path / "g.pt", weights_only=False).eval()
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in converted.modules())
    assert sum(isinstance(m, torch.nn.RMSNorm) for m in converted.modules()) == 5
    idx = torch.randint(0, 60, (2, 20))
    with torch.no_grad():
        la, lb = model.eval()(idx).logits, converted(idx).logits
    assert (la - lb).abs().max() <= 1e-5 * la.abs().max()
    from normlab.convert import gpt2_to_rmsnorm

    with torch.no_grad():
        a = copy.deepcopy(model).double()
        b = gpt2_to_rmsnorm(copy.deepcopy(a))
        assert (a(idx).logits - b(idx).logits).abs().max() <= 1e-10


def test_zero_mean_writers_make_pre_rmsnorm_compute_pre_ln_and_their_gradients_equal():
    """The training-time identity: from the same raw weights, Pre-LN and Pre-RMSNorm with zero-mean
    writers give the same loss and the same gradient for every parameter (float64), so the same
    optimizer trajectory; without zero-mean writers they differ."""
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
    ln = _model(norm="layernorm", linear_bias=True)
    zm = _model(norm="rmsnorm", linear_bias=True, zero_mean_writers=True)
    plain = _model(norm="rmsnorm", linear_bias=True)
    zm.load_state_dict(ln.state_dict())
    plain.load_state_dict(ln.state_dict())
    losses = []
    for m in (ln, zm, plain):
        loss = m(idx, idx)[1]
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 1e-12 and abs(losses[0] - losses[2]) > 1e-4
    for (name, p), q in zip(ln.named_parameters(), zm.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_zero_mean_writers_are_refused_where_norms_do_not_read_the_stream():
    with pytest.raises(ValueError, match="zero_mean_writers needs a placement"):
        ModelArgs(placement="post", zero_mean_writers=True).check()


@pytest.mark.slow
def test_pre_ln_and_pre_rmsnorm_with_zero_mean_writers_train_alike_for_50_steps(
    tmp_path, data_args
):
    """The control as users run it: two train.py runs from the same seed, 50 steps; their loss
    curves agree to float32 error (bound 1e-4 nats at every step), the mean-energy fraction of the
    zero-mean run is ~0 while Pre-LN's is not."""
    common = [
        f"--config={TINY}",
        f"log.out_dir={tmp_path}",
        "train.sample_tokens=0",
        "train.steps=50",
        "train.threads=1",
        "model.init_embedding_mean=0.2",
        *(a for a in data_args if a.startswith("data.")),  # the session's prepared corpus
    ]
    curves, energy = {}, {}
    for name, extra in (
        ("ln", ["--norm", "layernorm"]),
        ("zm", ["--norm", "rmsnorm", "model.zero_mean_writers=true"]),
    ):
        done = _run(ROOT / "train.py", *common, *extra, "--name", name, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
        curves[name] = [r["train/loss"] for r in records if "train/loss" in r]
        energy[name] = [
            r["norm_in/mean_energy/layer_0"] for r in records if "norm_in/mean_energy/layer_0" in r
        ]
    assert len(curves["ln"]) == len(curves["zm"]) == 50
    diff = max(abs(a - b) for a, b in zip(curves["ln"], curves["zm"], strict=True))
    assert diff <= 1e-4, diff
    assert max(energy["zm"]) < 1e-6 < min(energy["ln"])
