"""Tokens/s of a full training step (forward, backward, AdamW) of our model against transformers'
LlamaForCausalLM at the same configuration, dtype and batch, measured side by side in one process.

    python scripts/bench_train.py [--config configs/default.yaml] [--rounds 5] [--steps 5] [--no-compile]

Variants run in alternating rounds (each round times every variant for --steps steps after one warm-up
step), so that machine noise hits them alike; the table reports tokens/s (median over rounds) and each
variant's ratio to transformers' Llama (median and min..max over rounds). Then "where the time goes":
the share of the step spent in norms, measured by ablation (the same model with the norms replaced by
identity, alternated with it), and the profiler's top operators of one step.

The CPU allocator setting is stated: train.py applies `tune_cpu` (glibc mallopt) and so does this
script, unless --no-malloc-tuning is given.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from model import Llama  # noqa: E402
from training.config import load_config  # noqa: E402
from training.cpu import tune_cpu  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def make_step(model: torch.nn.Module, hf: bool, dtype: str, device: torch.device):
    """One optimizer step on (x, y) as a closure, for our Llama or a transformers LlamaForCausalLM."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step(x, y):
        with autocast:
            logits = model(input_ids=x).logits if hf else model(x)[0]
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())  # the same loss for both
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_variants(cfg, device, compile_too: bool) -> dict:
    from model.hf import to_hf

    variants = {}
    for norm in ("rmsnorm", "layernorm"):
        for impl in ("fast", "reference"):
            torch.manual_seed(0)
            args = cfg.model.__class__(**{**vars(cfg.model), "norm": norm, "norm_impl": impl})
            variants[f"ours {norm} ({impl})"] = (Llama(args).to(device), False)
    torch.manual_seed(0)
    ref_args = cfg.model.__class__(**{**vars(cfg.model), "norm": "rmsnorm", "norm_impl": "reference"})
    hf = to_hf(Llama(ref_args))
    hf.config._attn_implementation = "sdpa"
    variants["transformers Llama"] = (hf.to(device), True)
    steps = {name: make_step(m, is_hf, cfg.train.dtype, device) for name, (m, is_hf) in variants.items()}
    if compile_too:
        for name in ("ours rmsnorm (fast)", "ours layernorm (fast)", "transformers Llama"):
            torch.manual_seed(0)
            m, is_hf = variants[name]
            m2 = Llama(m.args).to(device) if not is_hf else to_hf(Llama(ref_args)).to(device)
            steps[f"{name} compiled"] = make_step(torch.compile(m2), is_hf, cfg.train.dtype, device)
    return steps


def time_rounds(steps: dict, x, y, device, rounds: int, n: int) -> dict[str, list[float]]:
    """Seconds per step of every variant, one value per round, variants alternating within a round."""
    for step in steps.values():  # warm-up (and compilation) outside the timed rounds
        step(x, y)
    out = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            sync(device)
            t = time.perf_counter()
            for _ in range(n):
                step(x, y)
            sync(device)
            out[name].append((time.perf_counter() - t) / n)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "default.yaml"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-malloc-tuning", action="store_true")
    p.add_argument("--no-breakdown", action="store_true", help="skip the norm-share ablation and the profiler")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. train.batch_size=16)")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and cfg.train.dtype == "float32":
        cfg.train.dtype = "bfloat16"  # the GPU section runs in bfloat16
    allocator = "default (glibc)" if a.no_malloc_tuning or device.type != "cpu" else tune_cpu()
    B, T, V = cfg.train.batch_size, cfg.train.seq_len, cfg.model.vocab_size
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (B, T), generator=gen).to(device)
    y = torch.randint(0, V, (B, T), generator=gen).to(device)
    steps = build_variants(cfg, device, not a.no_compile)
    times = time_rounds(steps, x, y, device, a.rounds, a.steps)

    print(f"\n## Training step: tokens/s ({device}, {torch.get_num_threads()} threads, {cfg.train.dtype}, "
          f"batch {B}x{T}, dim {cfg.model.dim}, {cfg.model.n_layers} layers, vocab {V}; allocator: {allocator}; "
          f"{a.rounds} alternating rounds of {a.steps} steps)\n")
    print("| variant | tokens/s (median) | ratio to transformers Llama: median | min..max |")
    print("|---|---|---|---|")
    hf = times["transformers Llama"]
    for name, ts in times.items():
        ratios = [h / t for t, h in zip(ts, hf, strict=True)]
        print(f"| {name} | {B * T / statistics.median(ts):,.0f} | {statistics.median(ratios):.2f} | "
              f"{min(ratios):.2f}..{max(ratios):.2f} |")

    if a.no_breakdown:
        return 0
    print("\n## Share of the step spent in norms (ablation: the same model with identity norms, alternated)\n")
    print("| model | step ms (median) | without norms ms | share in norms |")
    print("|---|---|---|---|")
    for norm in ("rmsnorm", "layernorm"):
        for impl in ("fast", "reference"):
            pair = {}
            for n in (norm, "none"):
                torch.manual_seed(0)
                args = cfg.model.__class__(**{**vars(cfg.model), "norm": n, "norm_impl": impl})
                pair[n] = make_step(Llama(args).to(device), False, cfg.train.dtype, device)
            t = time_rounds(pair, x, y, device, a.rounds, a.steps)
            with_n, without = statistics.median(t[norm]), statistics.median(t["none"])
            print(f"| {norm} ({impl}) | {with_n * 1e3:.1f} | {without * 1e3:.1f} | "
                  f"{100 * (with_n - without) / with_n:.1f}% |")

    print("\n## Profiler: top operators of one step, ours rmsnorm (reference) vs (fast)\n")
    for impl in ("reference", "fast"):
        torch.manual_seed(0)
        args = cfg.model.__class__(**{**vars(cfg.model), "norm": "rmsnorm", "norm_impl": impl})
        step = make_step(Llama(args).to(device), False, cfg.train.dtype, device)
        step(x, y)
        with torch.profiler.profile() as prof:
            step(x, y)
        print(f"### rmsnorm ({impl})\n```")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
        print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
