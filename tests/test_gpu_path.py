"""The GPU path's choices, checked on CPU: SDPA inputs that keep a fused kernel, TF32, MFU, the GPU
script."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model.layers import expand_kv, runs_in_float32
from training.distributed import use_tf32

REPO = Path(__file__).resolve().parent.parent


class _On:
    """Stands in for a tensor on another device (only .device.type and .dtype are read)."""

    def __init__(self, device: str, dtype: torch.dtype):
        self.device, self.dtype = torch.device(device), dtype


def test_gqa_repeats_kv_heads_only_for_float32_on_cuda():
    assert expand_kv(_On("cuda", torch.float32))  # enable_gqa would force the math kernel
    assert not expand_kv(_On("cuda", torch.bfloat16))  # flash attention implements enable_gqa
    assert not expand_kv(_On("cpu", torch.float32))
    # under autocast SDPA runs in the autocast dtype, whatever q's dtype (RoPE's float32 tables
    # promote q)
    assert not runs_in_float32("cuda", torch.float32, True, torch.bfloat16)
    assert runs_in_float32("cuda", torch.float32, True, torch.float32) and runs_in_float32(
        "cuda", torch.float32, False, torch.bfloat16
    )
    assert not runs_in_float32("cpu", torch.float32, False, torch.bfloat16)


def test_repeated_kv_heads_give_the_same_attention_as_enable_gqa():
    q, k, v = torch.randn(2, 8, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    gqa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=True
    )
    torch.testing.assert_close(gqa, rep)


def test_tf32_is_switched_on_through_the_api_inductor_reads():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        use_tf32()
        # torch.get_float32_matmul_precision() must still answer (inductor's max-autotune asks it):
        # the per-backend fp32_precision API made it raise ('mix of the legacy and new APIs')
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


@pytest.mark.slow
def test_gpu_script_dry_run_prints_the_norm_and_step_tables():
    r = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        "| rmsnorm | ours (fused) | bfloat16 |" in r.stdout
        and "| layernorm | torch.nn.LayerNorm |" in r.stdout
    )
    rows = [line for line in r.stdout.splitlines() if line.startswith("| gpt2-124m")]
    assert len(rows) == 2 and "| bfloat16 |" in rows[0] and "| float32 |" in rows[1]


@pytest.mark.slow
def test_gpu_script_without_a_gpu_is_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().startswith("error: no CUDA device")


def test_gpu_identity_script_dry_run_shows_the_identities(capsys):
    """bench/gpu_identity.py on CPU: the converted model's float64 logits are the LN model's, the
    zero-mean pair trains alike in float32 and its norms see no mean; plain Pre-RMSNorm's do."""
    from bench import gpu_identity

    assert gpu_identity.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| float")]
    conversion = {r[0].strip(): r[1:] for r in rows if len(r) == 3}
    training = {r[0].strip(): r[1:] for r in rows if len(r) > 3}
    assert float(conversion["float64"][1]) < 1e-12 and float(conversion["float32"][1]) < 1e-5
    f32 = [float(c) for c in training["float32"][2:]]
    first, every, _, ln_zm, rms_zm, plain = f32
    assert every < 1e-5 and max(ln_zm, rms_zm) < 1e-12 and plain > 1e-3
