"""FLOPs per token against torch's own FLOP counter on a real forward + backward, and the MFU
arithmetic."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from model import Llama, ModelArgs
from training.flops import flops_per_token, matmul_params, mfu, peak_flops


@pytest.mark.parametrize(
    "kw", [dict(), dict(n_kv_heads=2), dict(ffn="relu"), dict(tie_embeddings=True)]
)
def test_flops_per_token_is_what_torch_counts_for_a_training_step(kw):
    """6 N: torch counts the model's matmuls of a forward + backward (its CPU attention kernel is
    not counted); 12 L d T: torch counts attention written as matmuls, forward + backward, over the
    same shapes."""
    args = ModelArgs(dim=64, n_layers=3, n_heads=4, vocab_size=512, max_seq_len=32, **kw)
    model = Llama(args)
    B, T = 2, 32
    idx = torch.randint(0, 512, (B, T))
    with FlopCounterMode(display=False) as counter:
        model(idx, idx)[1].backward()
    matmuls = counter.get_flop_counts()["Global"][torch.ops.aten.mm] / (B * T)
    q, k, v = (torch.randn(B, args.n_heads, T, args.head_dim, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        ((q @ k.transpose(-1, -2)).softmax(-1) @ v).sum().backward()
    attention = counter.get_total_flops() / (B * T) * args.n_layers
    assert flops_per_token(args, T) == pytest.approx(matmuls + attention, rel=1e-9)


def test_matmul_params_are_the_models_matrices():
    args = ModelArgs(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=512)
    model = Llama(args)
    matrices = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert matmul_params(args) == matrices


def test_mfu_of_a_known_device_and_none_elsewhere():
    peak = peak_flops("NVIDIA H200", "bfloat16")
    assert peak == 989e12 and mfu(1e6, 1e9, peak) == pytest.approx(1e15 / 989e12)
    assert peak_flops("cpu", "float32") is None and mfu(1e6, 1e9, None) is None
    # the PCIe and NVL parts have lower peaks than the SXM part whose name they contain (MFU was
    # understated)
    assert (
        peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
        and peak_flops("NVIDIA H100 NVL", "float32") == 418e12
    )
    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
