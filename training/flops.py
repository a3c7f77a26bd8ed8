"""Model FLOPs per token and model FLOPs utilization (MFU): how much of the device's peak the run
uses.

Training FLOPs per token (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B): 6 N for the
weight matmuls (2 forward, 4 backward per parameter) plus 12 L d T for attention's scores and
weighted values over a context of T tokens (full, not halved for the causal mask, as PaLM counts), N
the parameters of every matmul (blocks' matrices and the output head; not the embedding lookup). MFU
= tokens/s * FLOPs per token / peak."""

from __future__ import annotations

from model.args import ModelArgs

# dense (no sparsity) peak TFLOP/s per device, by the dtype its matmuls run in; float32 means TF32
# tensor cores where the device has them (train.py enables TF32 on CUDA). From the vendors' data
# sheets; the first key that the device name contains wins, so the PCIe / NVL parts (lower clocks
# and power) come before their SXM namesakes.
PEAK_TFLOPS = {
    "H200 NVL": {"bfloat16": 836.0, "float16": 836.0, "float32": 418.0},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 494.0},
    "H100 PCIE": {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0},
    "H100 NVL": {"bfloat16": 835.0, "float16": 835.0, "float32": 418.0},
    "H100": {"bfloat16": 989.0, "float16": 989.0, "float32": 494.0},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0},
    "L40S": {"bfloat16": 362.0, "float16": 362.0, "float32": 183.0},
    "A10G": {"bfloat16": 70.0, "float16": 70.0, "float32": 35.0},
    "V100": {"float16": 125.0, "float32": 15.7},
}


def matmul_params(args: ModelArgs) -> int:
    """Parameters that take part in a matmul per token: every block's matrices and the output
    head."""
    d, h, kv, hd, f = args.dim, args.n_heads, args.kv_heads, args.head_dim, args.ffn_hidden_dim
    attention = d * h * hd + 2 * d * kv * hd + h * hd * d
    ffn = (3 if args.ffn == "swiglu" else 2) * d * f
    return args.n_layers * (attention + ffn) + d * args.vocab_size


def flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token: 6 N + 12 L d T (see the module docstring)."""
    return 6.0 * matmul_params(args) + 12.0 * args.n_layers * args.dim * seq_len


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The device's dense peak FLOP/s for `dtype`, or None when it is not in PEAK_TFLOPS (CPUs,
    unknown GPUs)."""
    for key, peaks in PEAK_TFLOPS.items():
        if key in device_name.upper():
            tflops = peaks.get(dtype)
            return tflops * 1e12 if tflops else None
    return None


def mfu(tokens_per_s: float, fpt: float, peak: float | None) -> float | None:
    """Model FLOPs utilization in [0, 1]; None without a known peak."""
    return tokens_per_s * fpt / peak if peak else None
