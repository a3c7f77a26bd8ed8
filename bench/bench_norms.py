"""RMSNorm vs LayerNorm, every implementation, forward and forward+backward, against the memory
floor.

    python -m bench.bench_norms [--shapes 32x512x768 32x128x128] [--dtypes float32 bfloat16]
        [--repeats 15]

Implementations: ours (reference formula, eager ops), ours fused (FusedRMSNorm / FusedLayerNorm,
whose kernels are fused/norms.py), torch.nn.RMSNorm, torch.nn.LayerNorm without and with bias, and
torch.compile of our reference. The memory floor is what any norm must at least cost: a copy of the
tensor (forward) plus one elementwise pass producing the input gradient (backward). All
implementations of one shape and dtype are timed in alternating rounds, in a fresh random order each
round (median and min..max over rounds); "x floor" is the median time over the floor's; the paired
column is the median (and IQR) of per-round ratios to torch.nn.LayerNorm(bias=False). "saved" counts
the bytes autograd keeps for backward (saved-tensor hooks); "peak" the extra memory one
forward+backward allocates at its peak (CUDA: the allocator's peak; CPU: the profiler's allocation
trace).

CPU allocator: by default this script applies the same glibc setting as train.py (training/cpu.py);
--no-malloc-tuning measures glibc's default, where every fresh large tensor page-faults.
On CUDA it times with CUDA events in bfloat16 and float32.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from bench.benchlib import SavedOutput
from fused import kernel_available
from model.fused_norms import FusedLayerNorm, FusedRMSNorm
from model.norms import LayerNorm, RMSNorm
from training.config import number
from training.cpu import tune_cpu


class Floor(torch.nn.Module):
    """A copy forward and one elementwise op backward: the least a norm's memory traffic can be."""

    def forward(self, x):
        return _Copy.apply(x)


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 1.0001  # reads g, writes dx


BASELINE = "layernorm | torch.nn.LayerNorm(bias=False)"


def implementations(
    d: int, dtype: torch.dtype, device, compiled: bool
) -> dict[str, torch.nn.Module]:
    impls = {
        "rmsnorm | ours (reference)": RMSNorm(d),
        "rmsnorm | ours (fused)": FusedRMSNorm(d),
        "rmsnorm | torch.nn.RMSNorm": torch.nn.RMSNorm(d, eps=1e-5),
        "layernorm | ours (reference)": LayerNorm(d),
        "layernorm | ours (fused)": FusedLayerNorm(d),
        BASELINE: torch.nn.LayerNorm(d, bias=False),
        "layernorm | torch.nn.LayerNorm": torch.nn.LayerNorm(d),
        "floor | copy + elementwise backward": Floor(),
    }
    if compiled:
        impls["rmsnorm | torch.compile(ours reference)"] = torch.compile(RMSNorm(d))
        impls["layernorm | torch.compile(ours reference)"] = torch.compile(LayerNorm(d))
    return {k: m.to(device=device, dtype=dtype) for k, m in impls.items()}


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t


def saved_bytes(module, x) -> int:
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: sizes.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        module(x.detach().requires_grad_())
    return sum(sizes)


def peak_bytes(fn, device) -> int:
    """Extra bytes allocated at the peak of fn()."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with torch.profiler.profile(profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start
    )
    level = peak = 0
    for e in events:
        level += e.cpu_memory_usage
        peak = max(peak, level)
    return peak


def bench(shape, dtype, device, repeats: int, compiled: bool) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    g = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    impls = implementations(shape[-1], dtype, device, compiled)
    timer = Timer(device)

    def fwd(m):
        with torch.no_grad():
            m(x)

    def fwd_bwd(m):
        xx = x.detach().requires_grad_()
        m(xx).backward(g)

    for m in impls.values():  # warm-up: compilation, kernel build, allocator
        fwd(m)
        fwd_bwd(m)
    times = {k: {"fwd": [], "fwd+bwd": []} for k in impls}
    order = random.Random(0)
    # alternating: every implementation once per round, in a fresh random order
    for _ in range(repeats):
        names = list(impls)
        order.shuffle(names)
        for k in names:
            m = impls[k]
            times[k]["fwd"].append(timer(lambda m=m: fwd(m)))
            times[k]["fwd+bwd"].append(timer(lambda m=m: fwd_bwd(m)))
    floor = {
        mode: statistics.median(times["floor | copy + elementwise backward"][mode])
        for mode in ("fwd", "fwd+bwd")
    }
    rows = []
    for k, m in impls.items():
        row = {
            "impl": k,
            "shape": "x".join(map(str, shape)),
            "dtype": str(dtype).removeprefix("torch."),
        }
        for mode in ("fwd", "fwd+bwd"):
            ts = times[k][mode]
            row[mode] = (
                statistics.median(ts) * 1e3,
                min(ts) * 1e3,
                max(ts) * 1e3,
                statistics.median(ts) / floor[mode],
            )
        # paired per-round ratio to torch.nn.LayerNorm(bias=False): the fused path's bar
        ratios = sorted(t / b for t, b in zip(ts, times[BASELINE]["fwd+bwd"], strict=True))
        quart = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        row["vs_ln"] = (statistics.median(ratios), quart[0], quart[2])
        row["saved"] = saved_bytes(m, x) / 2**20
        row["peak"] = peak_bytes(lambda m=m: fwd_bwd(m), device) / 2**20
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["32x512x768", "32x128x128"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--repeats", type=number(int, ">= 1"), default=15)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-malloc-tuning", action="store_true")
    p.add_argument(
        "--save",
        metavar="FILE.md",
        help="also write the tables, under the command and the machine "
        "(CPU model, instruction sets, threads), to this file (docs/performance.md shows such "
        "files)",
    )
    a = p.parse_args(argv)
    command = " ".join(["python -m bench.bench_norms", *(sys.argv[1:] if argv is None else argv)])
    with SavedOutput(a.save, command):
        return tables(a)


def tables(a: argparse.Namespace) -> int:
    """Run the benchmark and print its tables."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    allocator = (
        "CUDA caching allocator"
        if device.type == "cuda"
        else tune_cpu(malloc=not a.no_malloc_tuning)["allocator"]
    )
    fast = (
        (
            f"fused C++ kernel, {torch.ops.normlab.norm_loops()} loops"
            if kernel_available()
            else "reference fallback"
        )
        if device.type == "cpu"
        else "torch fused kernels"
    )
    print(
        f"\n## Norms, forward and forward+backward ({device}, {torch.get_num_threads()} threads, "
        "torch "
        f"{torch.__version__}; allocator: {allocator}; ours (fused) = {fast}; {a.repeats} "
        "alternating rounds)\n"
    )
    print(
        "| norm | implementation | dtype | shape | fwd ms | fwd min..max | fwd x floor | fwd+bwd "
        "ms | "
        "fwd+bwd min..max | fwd+bwd x floor | fwd+bwd / LayerNorm(bias=False), paired: median "
        "(IQR) | "
        "saved for bwd MB | peak MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in a.shapes:
        for dtype in a.dtypes:
            dims = tuple(int(s) for s in shape.split("x"))
            for r in bench(dims, getattr(torch, dtype), device, a.repeats, not a.no_compile):
                norm, impl = r["impl"].split(" | ")
                f, fb = r["fwd"], r["fwd+bwd"]
                print(
                    f"| {norm} | {impl} | {r['dtype']} | {r['shape']} | {f[0]:.2f} | "
                    f"{f[1]:.2f}..{f[2]:.2f} | "
                    f"{f[3]:.2f} | {fb[0]:.2f} | {fb[1]:.2f}..{fb[2]:.2f} | {fb[3]:.2f} | "
                    f"{r['vs_ln'][0]:.2f} "
                    f"({r['vs_ln'][1]:.2f}..{r['vs_ln'][2]:.2f}) | {r['saved']:.1f} | "
                    f"{r['peak']:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
