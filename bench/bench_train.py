"""Tokens/s of a full training step (forward, loss, backward, AdamW) of our model against
transformers' LlamaForCausalLM at the same configuration, weights, dtype, batch and optimizer, side
by side in one process.

    python -m bench.bench_train [--config configs/train/default.yaml] [--rounds 20] [--steps 1]
        [--no-compile]

Each model trains the way its library does: ours returns the loss from `model(x, targets)` (the
`model.ops_impl` in the config), transformers' from `model(input_ids=x, labels=..., shift_labels=y)`
(F.cross_entropy on float32 logits). Both start from the same weights and the script checks that
their first losses agree. One row also runs our model with the loss computed outside it by
F.cross_entropy (as for transformers), which separates what the model and what the fused loss
contribute.

Variants alternate within each round, in a fresh random order every round, so that this shared
machine's noise hits them alike; the tables report tokens/s (median over rounds) and paired
per-round ratios (median, and the interquartile range). Then "where the time goes": the share of the
step spent in norms, by ablation (the same model with identity norms, alternated with it), and the
profiler's top operators.

The CPU allocator setting is stated: train.py applies `tune_cpu` (glibc mallopt) and so does this
script, unless --no-malloc-tuning is given.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.benchlib import SavedOutput
from model import Llama
from training.config import load_config, number
from training.cpu import tune_cpu

REPO = Path(__file__).resolve().parent.parent


def make_step(model: torch.nn.Module, kind: str, dtype: str, device: torch.device):
    """One optimizer step on (x, y) as a closure. kind: "ours" (our model computes its loss), "hf"
    (a transformers LlamaForCausalLM computes its loss from labels) or "logits" (our model's logits,
    then F.cross_entropy outside it)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step(x, y):
        with autocast:
            if kind == "ours":
                loss = model(x, y)[1]
            elif kind == "hf":  # shift_labels: the targets as given, no shift inside transformers
                loss = model(input_ids=x, labels=y, shift_labels=y).loss
            else:
                loss = F.cross_entropy(model(x)[0].flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _ours(cfg, device, **changes) -> Llama:
    torch.manual_seed(0)  # the same weights for every variant
    return Llama(cfg.model.__class__(**{**vars(cfg.model), **changes})).to(device)


def build_variants(cfg, device, compile_too: bool) -> dict:
    from model.hf import to_hf

    def hf_model():
        m = to_hf(_ours(cfg, "cpu", norm="rmsnorm", norm_impl="reference", ops_impl="reference"))
        m.config._attn_implementation = "sdpa"
        return m.to(device)

    fast = {"norm_impl": "fused", "ops_impl": "fused"}
    ref = {"norm_impl": "reference", "ops_impl": "reference"}
    models = {}
    for norm in ("rmsnorm", "layernorm"):
        models[f"ours {norm} (fused)"] = (_ours(cfg, device, norm=norm, **fast), "ours")
        models[f"ours {norm} (reference)"] = (_ours(cfg, device, norm=norm, **ref), "ours")
    outside = _ours(cfg, device, norm="rmsnorm", **fast)
    models["ours rmsnorm (fused norms), loss outside"] = (outside, "logits")
    models["transformers Llama"] = (hf_model(), "hf")
    steps = {
        name: make_step(m, kind, cfg.train.dtype, device) for name, (m, kind) in models.items()
    }
    if compile_too:
        for norm in ("rmsnorm", "layernorm"):
            steps[f"ours {norm} (fused) compiled"] = make_step(
                torch.compile(_ours(cfg, device, norm=norm, **fast)),
                "ours",
                cfg.train.dtype,
                device,
            )
        steps["transformers Llama compiled"] = make_step(
            torch.compile(hf_model()), "hf", cfg.train.dtype, device
        )
    return steps


def time_rounds(
    steps: dict, x, y, device, rounds: int, n: int, same_model: bool = True
) -> dict[str, list[float]]:
    """Seconds per step of every variant, one value per round; variants alternate within a round, in
    a fresh random order every round. The first step of each (and compilation) is not timed; with
    same_model, the first losses of all variants must agree (same weights, same batch)."""
    first = {name: step(x, y).item() for name, step in steps.items()}
    ref = (
        first["transformers Llama"] if "transformers Llama" in first else next(iter(first.values()))
    )
    for name, value in first.items():
        if same_model and abs(value - ref) > 1e-3 * abs(ref):
            raise SystemExit(
                f"bench_train: {name} starts from loss {value:.6f}, not {ref:.6f}: not the same "
                "model"
            )
    out = {name: [] for name in steps}
    order = random.Random(0)
    for _ in range(rounds):
        names = list(steps)
        order.shuffle(names)  # no variant always runs first, last or after the same one
        for name in names:
            sync(device)
            t = time.perf_counter()
            for _ in range(n):
                steps[name](x, y)
            sync(device)
            out[name].append((time.perf_counter() - t) / n)
    return out


def ratio_stats(num: list[float], den: list[float]) -> str:
    """Paired per-round speed ratio den/num (>1: num is faster): median and interquartile range."""
    r = sorted(d / t for t, d in zip(num, den, strict=True))
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    return f"{statistics.median(r):.2f} | {q[0]:.2f}..{q[2]:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "train" / "default.yaml"))
    p.add_argument("--rounds", type=number(int, ">= 1"), default=20)
    p.add_argument(
        "--steps", type=number(int, ">= 1"), default=1, help="timed steps per variant per round"
    )
    p.add_argument("--no-compile", action="store_true")
    p.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="time only the variants whose name contains TEXT (repeatable; transformers' Llama "
        "always runs), e.g. --only '(fused)' for more rounds of the ones that matter",
    )
    p.add_argument("--no-malloc-tuning", action="store_true")
    p.add_argument(
        "--save",
        metavar="FILE.md",
        help="also write the tables, under the command and the machine "
        "(CPU model, instruction sets, threads), to this file (docs/performance.md shows such "
        "files)",
    )
    p.add_argument(
        "--no-breakdown", action="store_true", help="skip the norm-share ablation and the profiler"
    )
    p.add_argument(
        "overrides", nargs="*", help="key=value config overrides (e.g. train.batch_size=16)"
    )
    a = p.parse_args(argv)
    command = " ".join(["python -m bench.bench_train", *(sys.argv[1:] if argv is None else argv)])
    with SavedOutput(a.save, command):
        return tables(a)


def tables(a: argparse.Namespace) -> int:
    """Run the benchmark and print its tables."""
    cfg = load_config(a.config, a.overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and cfg.train.dtype == "float32":
        cfg.train.dtype = "bfloat16"  # the GPU section runs in bfloat16
    allocator = (
        "default (glibc)" if a.no_malloc_tuning or device.type != "cpu" else tune_cpu()["allocator"]
    )
    B, T, V = cfg.train.batch_size, cfg.train.seq_len, cfg.model.vocab_size
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (B, T), generator=gen).to(device)
    y = torch.randint(0, V, (B, T), generator=gen).to(device)
    steps = build_variants(cfg, device, not a.no_compile)
    if a.only:
        steps = {
            k: v
            for k, v in steps.items()
            if k == "transformers Llama" or any(t in k for t in a.only)
        }
    times = time_rounds(steps, x, y, device, a.rounds, a.steps)

    print(
        f"\n## Training step: tokens/s ({device}, {torch.get_num_threads()} threads, "
        f"{cfg.train.dtype}, "
        f"batch {B}x{T}, dim {cfg.model.dim}, {cfg.model.n_layers} layers, vocab {V}; allocator: "
        f"{allocator}; "
        f"{a.rounds} alternating rounds of {a.steps} step(s))\n"
    )
    print("| variant | tokens/s (median) | ratio to transformers Llama: median | IQR |")
    print("|---|---|---|---|")
    hf = times["transformers Llama"]
    for name, ts in times.items():
        print(f"| {name} | {B * T / statistics.median(ts):,.0f} | {ratio_stats(ts, hf)} |")
    print("\n| pair | speed ratio: median | IQR |")
    print("|---|---|---|")
    pairs = [
        ("ours rmsnorm (fused)", "ours rmsnorm (reference)"),
        ("ours layernorm (fused)", "ours layernorm (reference)"),
        ("ours rmsnorm (fused)", "ours layernorm (fused)"),
        ("ours rmsnorm (reference)", "ours layernorm (reference)"),
        ("ours rmsnorm (fused) compiled", "ours layernorm (fused) compiled"),
        ("ours rmsnorm (fused)", "ours rmsnorm (fused norms), loss outside"),
    ]
    for fast_one, slow_one in pairs:
        if fast_one in times and slow_one in times:
            print(f"| {fast_one} / {slow_one} | {ratio_stats(times[fast_one], times[slow_one])} |")

    if a.no_breakdown:
        return 0
    print(
        "\n## Share of the step spent in norms (ablation: the same model with identity norms, "
        "alternated)\n"
    )
    print("| model | step ms (median) | without norms ms | share in norms |")
    print("|---|---|---|---|")
    for norm in ("rmsnorm", "layernorm"):
        for impl in ("fused", "reference"):
            pair = {}
            for n in (norm, "none"):
                pair[n] = make_step(
                    _ours(cfg, device, norm=n, norm_impl=impl, ops_impl=impl),
                    "ours",
                    cfg.train.dtype,
                    device,
                )
            t = time_rounds(pair, x, y, device, a.rounds, a.steps, same_model=False)
            with_n, without = statistics.median(t[norm]), statistics.median(t["none"])
            print(
                f"| {norm} ({impl}) | {with_n * 1e3:.1f} | {without * 1e3:.1f} | "
                f"{100 * (with_n - without) / with_n:.1f}% |"
            )

    print("\n## Profiler: top operators of one step, ours rmsnorm (reference) vs (fused)\n")
    for impl in ("reference", "fused"):
        step = make_step(
            _ours(cfg, device, norm="rmsnorm", norm_impl=impl, ops_impl=impl),
            "ours",
            cfg.train.dtype,
            device,
        )
        step(x, y)
        with torch.profiler.profile() as prof:
            step(x, y)
        print(f"### rmsnorm ({impl})\n```")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
        print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
