"""One GPU check sized for a 10-minute call: the norm table, then the step table with MFU for the
~124M config.

    python -m bench.gpu_check                 # on a CUDA machine
    python -m bench.gpu_check --dry-run       # the same code path on CPU, tiny sizes (tested)

Norm table: bench/bench_norms.py on GPU-sized shapes in bfloat16 and float32. Step table:
configs/train/gpt2-124m.yaml (bfloat16 autocast, torch.compile) and the same model in float32 (TF32
matmuls) without compile, each trained for --steps optimizer steps of one micro-batch on random
tokens after --warmup steps (compilation); tokens/s, ms per step, MFU (training/flops.py: 6N + 12LdT
FLOPs per token over the device's dense peak) and peak memory. Random tokens: no dataset download,
and the step time does not depend on the data."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.benchlib import gpu_device, gpu_parser
from model import Llama
from training.config import load_config, number
from training.distributed import use_tf32
from training.flops import flops_per_token, peak_flops
from training.optim import build_optimizer
from training.step import StepParts, autocast_for, no_clip, scaler_for, train_step

REPO = Path(__file__).resolve().parent.parent
TINY = [
    "model.dim=64",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.hidden_dim=128",
    "data.vocab_size=256",
    "train.seq_len=32",
    "train.micro_batch_size=2",
]


def step_row(name: str, overrides: list[str], device: torch.device, steps: int, warmup: int) -> str:
    """Train `steps` timed steps (after `warmup`) of the 124M config with these overrides; one table
    row."""
    cfg = load_config(REPO / "configs" / "train" / "gpt2-124m.yaml", overrides)
    tc = cfg.train
    torch.manual_seed(0)
    model = Llama(cfg.model).to(device)
    opt = build_optimizer(model, cfg.optim)
    micro = tc.micro_batch_size
    compiled = torch.compile(model) if tc.compile else model
    parts = StepParts(
        model=model,
        ddp=model,
        compiled=compiled,
        opt=opt,
        micro=micro,
        accum=1,
        world_size=1,
        device=device,
        autocast=autocast_for(device, tc.dtype),
        z_loss=0.0,
        clip=no_clip(cfg.optim.grad_clip),
        tokens_per_step=micro * tc.seq_len,
        scaler=scaler_for(device, tc.dtype),
        flops_per_step=flops_per_token(cfg.model, tc.seq_len) * micro * tc.seq_len,
        peak_flops=peak_flops(torch.cuda.get_device_name(device), tc.dtype)
        if device.type == "cuda"
        else None,
    )
    gen = torch.Generator().manual_seed(0)
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup + steps):
        idx = torch.randint(0, cfg.model.vocab_size, (micro, tc.seq_len + 1), generator=gen)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        train_step(parts, (idx[:, :-1], idx[:, 1:]), cfg.optim.lr)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # timed to the end of the optimizer's kernels (train_step's own timer stops before)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    mfu = parts.flops_per_step / (ms / 1e3) / parts.peak_flops if parts.peak_flops else None
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return (
        f"| {name} | {model.num_params() / 1e6:.1f}M | {tc.dtype} | {tc.compile} | "
        f"{micro}x{tc.seq_len} | "
        f"{ms:.1f} ({min(times) * 1e3:.1f}..{max(times) * 1e3:.1f}) | "
        f"{micro * tc.seq_len / ms * 1e3:,.0f} | "
        f"{'-' if mfu is None else f'{mfu:.1%}'} | {mem:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = gpu_parser(__doc__)
    p.add_argument("--steps", type=number(int, ">= 1"), default=20)
    p.add_argument("--warmup", type=number(int, ">= 0"), default=5)
    a = p.parse_args(argv)
    device = gpu_device(a.dry_run)
    if device is None:
        return 2
    cuda = device.type == "cuda"
    if cuda:
        use_tf32()
    print(
        f"device: {torch.cuda.get_device_name(device) if cuda else 'cpu (dry run)'}, torch "
        f"{torch.__version__}"
    )
    shapes = ["8x1024x768", "8x2048x4096"] if cuda else ["4x32x64"]
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_norms.py"),
            "--shapes",
            *shapes,
            "--dtypes",
            "bfloat16",
            "float32",
            "--repeats",
            "15" if cuda else "3",
            *([] if cuda else ["--no-compile"]),
        ],
        check=True,
        cwd=REPO,
    )
    extra = [] if cuda else [*TINY, "train.compile=false", "train.device=cpu"]
    steps, warmup = (a.steps, a.warmup) if cuda else (2, 1)
    print(
        "\n| config | parameters | dtype | compile | micro-batch | ms / step, median (min..max) | "
        "tokens/s | "
        "MFU | peak GiB |\n|---|---|---|---|---|---|---|---|---|"
    )
    print(step_row("gpt2-124m", extra, device, steps, warmup), flush=True)
    print(
        step_row(
            "gpt2-124m float32 (TF32)",
            [*extra, "train.dtype=float32", "train.compile=false"],
            device,
            steps,
            warmup,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
