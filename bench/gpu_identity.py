"""The exact LayerNorm -> RMSNorm swap on a GPU, in the dtypes users train in (model/convert.py,
model.zero_mean_writers; docs/METHODS.md).

    python -m bench.gpu_identity              # on a CUDA machine
    python -m bench.gpu_identity --dry-run    # the same code path on CPU, tiny sizes (tested)

Conversion table: the ~124M config (gpt2-124m.yaml) as Pre-LN with a mean in its stream (embedding
mean 0.3 x init_std) and gains drawn in [0.5, 1.5]; the LN model's logits and the converted
Pre-RMSNorm model's in float64, float32 and bfloat16 on the device, each against the float64 LN
logits: the largest |difference| over the largest |logit|.

Training table: Pre-LN and Pre-RMSNorm, both with zero-mean writers (one function), from one seed,
--steps steps of a copy task (random segments repeated) at --lr (cosine, 20 warmup steps) through
training/step.py's train_step, in
bfloat16 autocast (compiled) and in float32: the largest |train-loss difference| over the first 10
steps and over all. Then the norms' inputs' mean-energy fraction, sum mean(x)^2 / sum mean(x^2) over
positions (forward hooks, eager): 0 up to rounding with zero-mean writers, about 1/d without."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from bench.benchlib import gpu_device, gpu_parser
from model import Llama
from model.convert import to_rmsnorm
from model.norms import LayerNorm, RMSNorm
from training.config import load_config, number
from training.optim import build_optimizer, lr_at
from training.step import StepParts, autocast_for, no_clip, scaler_for, train_step

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "train" / "gpt2-124m.yaml"
TINY = [
    "model.dim=64",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.hidden_dim=128",
    "data.vocab_size=256",
]


def pre_ln(overrides: list[str], device, dtype) -> Llama:
    """The config's model as Pre-LN with a stream mean and gains away from 1 (seed 0)."""
    cfg = load_config(CONFIG, [*overrides, "model.norm=layernorm", "model.placement=pre"])
    args = cfg.model
    args.init_embedding_mean = 0.3 * args.init_std
    torch.manual_seed(0)
    model = Llama(args)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def conversion_rows(overrides: list[str], device) -> list[str]:
    gen = torch.Generator().manual_seed(1)
    vocab = load_config(CONFIG, overrides).model.vocab_size
    idx = torch.randint(0, vocab, (2, 128), generator=gen).to(device)
    exact = pre_ln(overrides, device, torch.float64)
    ref = exact(idx)[0]
    scale = ref.abs().max().item()
    rows = []
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        ln = exact if dtype == torch.float64 else pre_ln(overrides, device, dtype)
        rms = to_rmsnorm(ln)
        err = [(m(idx)[0].double() - ref).abs().max().item() / scale for m in (ln, rms)]
        rows.append(f"| {str(dtype)[6:]} | {err[0]:.2e} | {err[1]:.2e} |")
        del ln, rms
    return rows


def copy_batch(gen, vocab: int, micro: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of a random segment repeated: the second copy is predictable (induction)."""
    seg = torch.randint(0, vocab, (micro, seq // 4 + 1), generator=gen)
    idx = seg.repeat(1, 4)[:, : seq + 1]
    return idx[:, :-1], idx[:, 1:]


def mean_energy(model: Llama, x: torch.Tensor, autocast) -> float:
    """sum over positions of mean(x)^2 / sum of mean(x^2), over every norm input of the blocks."""
    sums = torch.zeros(2, dtype=torch.float64, device=x.device)

    def hook(module, args):
        h = args[0].double()
        sums[0] += h.mean(-1).pow(2).sum()
        sums[1] += h.pow(2).mean(-1).sum()

    norms = [m for m in model.layers.modules() if isinstance(m, (LayerNorm, RMSNorm))]
    handles = [m.register_forward_pre_hook(hook) for m in norms]
    with torch.no_grad(), autocast:
        model(x)
    for h in handles:
        h.remove()
    return (sums[0] / sums[1]).item()


def train_pair(
    overrides: list[str], device, dtype: str, compile_: bool, steps: int, lr: float
) -> str:
    """One row: Pre-LN vs Pre-RMSNorm with zero-mean writers, and plain Pre-RMSNorm's energy."""
    losses, energy = {}, {}
    for norm, zm in (("layernorm", True), ("rmsnorm", True), ("rmsnorm", False)):
        cfg = load_config(
            CONFIG,
            [*overrides, f"model.norm={norm}", "model.placement=pre", f"train.dtype={dtype}"]
            + [f"model.zero_mean_writers={zm}", "optim.warmup_steps=20", f"optim.lr={lr}"],
        )
        torch.manual_seed(0)
        model = Llama(cfg.model).to(device)
        micro, seq = (8, 256) if device.type == "cuda" else (2, 32)
        parts = StepParts(
            model=model,
            ddp=model,
            compiled=torch.compile(model) if compile_ else model,
            opt=build_optimizer(model, cfg.optim),
            micro=micro,
            accum=1,
            world_size=1,
            device=device,
            autocast=autocast_for(device, dtype),
            z_loss=0.0,
            clip=no_clip(cfg.optim.grad_clip),
            tokens_per_step=micro * seq,
            scaler=scaler_for(device, dtype),
        )
        gen = torch.Generator().manual_seed(2)
        out = []
        for _ in range(steps):
            step = len(out)
            batch = copy_batch(gen, cfg.model.vocab_size, micro, seq)
            out.append(train_step(parts, batch, lr_at(step, cfg.optim, steps)))
        losses[(norm, zm)] = [float(r.record["train/loss"]) for r in out]
        x, _ = copy_batch(gen, cfg.model.vocab_size, micro, seq)
        energy[(norm, zm)] = mean_energy(model, x.to(device), autocast_for(device, dtype))
    a, b = losses[("layernorm", True)], losses[("rmsnorm", True)]
    diff = [abs(p - q) for p, q in zip(a, b, strict=True)]
    return (
        f"| {dtype} | {compile_} | {steps} | {max(diff[:10]):.2e} | {max(diff):.2e} | "
        f"{a[-1]:.4f} | {energy[('layernorm', True)]:.2e} | {energy[('rmsnorm', True)]:.2e} | "
        f"{energy[('rmsnorm', False)]:.2e} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = gpu_parser(__doc__)
    p.add_argument("--steps", type=number(int, ">= 21"), default=100)
    p.add_argument("--lr", type=number(float, "> 0"), default=6e-4)
    a = p.parse_args(argv)
    device = gpu_device(a.dry_run)
    if device is None:
        return 2
    cuda = device.type == "cuda"
    overrides = [] if cuda else [*TINY, "train.device=cpu"]
    name = torch.cuda.get_device_name(device) if cuda else "cpu (dry run)"
    print(f"device: {name}, torch {torch.__version__}")
    print(
        "\n| dtype | Pre-LN vs float64 | converted Pre-RMSNorm vs float64 |\n|---|---|---|",
        flush=True,
    )
    for row in conversion_rows(overrides, device):
        print(row, flush=True)
    print(
        "\n| train.dtype | compile | steps | max loss diff, steps 1-10 | max loss diff, all | "
        "final loss | mean energy LN+ZM | RMS+ZM | plain RMS |\n" + "|---" * 9 + "|"
    )
    runs = [("bfloat16", cuda), ("float32", False)]
    for dtype, compile_ in runs:
        steps = a.steps if cuda else 25
        print(train_pair(overrides, device, dtype, compile_, steps, a.lr), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
