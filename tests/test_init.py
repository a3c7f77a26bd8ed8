"""Init switches (residual scaling, embedding std) and scripts/init_grads.py at toy size."""

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
    wo_scaled, wo_plain = _std(scaled.layers[3].attention.wo.weight), _std(plain.layers[3].attention.wo.weight)
    assert wo_scaled == pytest.approx(0.02 / math.sqrt(16), rel=0.05) and wo_plain == pytest.approx(0.02, rel=0.05)
    assert _std(plain.layers[3].attention.wq.weight) == pytest.approx(0.02, rel=0.05)
    assert _std(plain.tok_embeddings.weight) == pytest.approx(1.0, rel=0.05)
    assert _std(scaled.tok_embeddings.weight) == pytest.approx(0.02, rel=0.05)
    with pytest.raises(ValueError, match="unknown init_residual 'xavier'; valid: plain, scaled"):
        ModelArgs(**base, init_residual="xavier").check()


@pytest.mark.slow
def test_init_grads_script_prints_its_table_report_and_figure(tmp_path):
    r = subprocess.run([sys.executable, "scripts/init_grads.py", "--depths", "2", "3", "--dim", "16", "--batch", "2",
                        "--seq", "8", "--seeds", "0", "1", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith(("| default |", "| xiong |", "| xiong-relu |"))]
    assert len(rows) == 3 * (len(BLOCKS) * 2 + 1) * 2  # settings x (placements x 2 norms + pre/none) x depths
    assert (tmp_path / "init_grads.png").stat().st_size > 10_000
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["findings"]) == 3 and "n = 2 seeds" in report["findings"][0]


def test_init_grads_direction_is_stated_only_when_every_seed_agrees():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from init_grads import direction
    finally:
        sys.path.pop(0)
    assert direction([3.0, 2.0]) == "rises with layer index" and direction([0.05, 0.2]) == "falls with layer index"
    assert direction([1.2, 0.9]) == "flat (within 1.5x)" and direction([3.0, 0.9]) == "seeds disagree"
    assert direction([1.03, 3.79]) == "rises with layer index"  # every seed rises, one by less than 1.5x
    assert direction([float("nan")]) == "not finite"


def test_relu_feed_forward_is_the_original_transformers():
    torch.manual_seed(0)
    model = Llama(ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=64, ffn="relu"))
    ff = model.layers[0].feed_forward
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(ff(x), torch.relu(x @ ff.w1.weight.T) @ ff.w2.weight.T)
    assert not hasattr(ff, "w3")
    with pytest.raises(ValueError, match="unknown ffn 'geglu'; valid: gelu, relu, relu2, swiglu"):
        Llama(ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=64, ffn="geglu"))


@pytest.mark.parametrize("ffn, act", [
    ("gelu", lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))),  # a * Phi(a), by hand
    ("relu2", lambda a: torch.where(a > 0, a * a, torch.zeros_like(a))),
])
def test_gelu_and_relu2_feed_forwards_match_their_formulas_with_relus_weights(ffn, act):
    def model(name):
        torch.manual_seed(0)
        return Llama(ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=64, ffn=name))

    ff, relu = model(ffn).layers[0].feed_forward, model("relu").layers[0].feed_forward
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(ff(x), act(x @ ff.w1.weight.T) @ ff.w2.weight.T)
    assert {k: v.shape for k, v in ff.state_dict().items()} == {k: v.shape for k, v in relu.state_dict().items()}
    for k, v in ff.state_dict().items():  # the same init: the same draws for the same seed
        torch.testing.assert_close(v, relu.state_dict()[k])
