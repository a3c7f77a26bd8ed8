"""One training step at a study's size, near this core's limit: steps/s of variants alternated,
where a step's time goes (forward / backward / clip / optimizer, and by op family), its GFLOP/s and
the fraction of the core's matmul peak, which the script measures itself.

    python -m bench.bench_step [--study lab/studies/norm-placement-lr.yaml] [--threads 1]
        [--rounds 15] [--steps 5] [--variant NAME ...] [--breakdown NAME ...] [--save FILE]
        [key=value ...]

The step is the project's own (training/step.py train_step: forward, loss, backward, clip, AdamW) on
the study file's model and batch (its overrides; the default study: d 64, 4 layers, 16 x 64 tokens,
vocab 1024), on random tokens, with `--threads` torch threads (1: as a study's workers run).
Variants (VARIANTS: the current code, or one previous implementation put back, by name) take turns
step block by step block in a fresh random order each round; the table gives each one's ms per step
(median, min..max over rounds) and its per-round speed ratio to the first variant. --breakdown
profiles the named variants (torch.profiler): the share of the step per phase and per op family, op
calls per step, GFLOP/s (training/flops.py's 6 N + 12 L d T per token over the unprofiled step time)
and that as a fraction of the peak: the best of a few float32 matmuls at the step's and at large
shapes, timed on the same threads.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import shlex
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import torch

import model.layers
import training.optim
from bench.benchlib import SavedOutput
from lab.studyfile import flatten, load_study
from model import Llama
from training.config import load_config, number
from training.cpu import tune_cpu
from training.flops import flops_per_token
from training.optim import build_optimizer, lr_at
from training.step import StepParts, autocast_for, train_step


def pairwise_rope(x: torch.Tensor, rope) -> torch.Tensor:
    """RoPE as it was: split each head into its pairs, rotate, stack them back."""
    cos, sin = (t.float()[:, None, :] for t in rope)
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)


# name -> what it puts back while its model is built and while it steps (a context manager);
# "current" is the code as it is
NO_FUSED_ADAMW = {"fused_adamw": lambda params: False}
VARIANTS = {
    "current": contextlib.nullcontext,
    "pairwise RoPE": lambda: mock.patch.object(model.layers, "apply_rope", pairwise_rope),
    "for-loop AdamW": lambda: mock.patch.multiple(training.optim, **NO_FUSED_ADAMW),
}
PREVIOUS = [name for name in VARIANTS if name != "current"]


@contextlib.contextmanager
def before():
    """Every previous implementation put back at once: the step before issue 44's changes."""
    with contextlib.ExitStack() as stack:
        for name in PREVIOUS:
            stack.enter_context(VARIANTS[name]())
        yield


VARIANTS["before (all put back)"] = before

FAMILIES = (  # (family, substrings of the op's name), the first match wins
    ("matmul", ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")),
    ("attention", ("scaled_dot_product", "softmax", "masked_fill")),
    ("norm kernel", ("normlab::norm",)),
    ("cross-entropy", ("cross_entropy", "nll_loss", "log_softmax", "logsumexp")),
    ("swiglu", ("normlab::swiglu", "silu")),
    ("optimizer kernels", ("_fused_adam", "_foreach", "lerp", "addcdiv", "addcmul")),
    (
        "copy / cat / flip",
        (
            "aten::cat",
            "aten::copy_",
            "aten::flip",
            "aten::_to_copy",
            "aten::clone",
            "aten::stack",
            "repeat_interleave",
            "aten::index",
            "aten::embedding",
        ),
    ),
    (
        "reduction",
        ("aten::sum", "aten::mean", "vector_norm", "aten::norm", "aten::max", "aten::amax"),
    ),
    (
        "elementwise",
        (
            "aten::mul",
            "aten::add",
            "aten::sub",
            "aten::neg",
            "aten::div",
            "aten::sqrt",
            "aten::rsqrt",
            "aten::pow",
            "aten::tanh",
            "aten::where",
            "aten::fill_",
            "aten::zero_",
            "aten::clamp",
            "aten::reciprocal",
            "aten::exp",
        ),
    ),
    ("allocation", ("aten::empty",)),
)


def family(name: str) -> str:
    return next(
        (f for f, keys in FAMILIES if any(k in name for k in keys)), "other (views, dispatch)"
    )


def study_config(path: str, threads: int, extra: list[str]):
    """The study file's training config (its overrides, then `extra`)."""
    study = load_study(Path(path))
    return load_config(
        study.config,
        [*flatten(study.overrides or {}), f"train.threads={threads}", *extra],
    )


def make_step(cfg):
    """A step of the study's model and optimizer: the project's train_step, as a run calls it."""
    torch.manual_seed(cfg.train.seed)
    net = Llama(cfg.model)
    tc, device = cfg.train, torch.device("cpu")

    def forward(x, y):
        with torch.profiler.record_function("forward"):
            return net(x, y)

    parts = StepParts(
        model=net,
        ddp=net,
        compiled=forward,
        opt=build_optimizer(net, cfg.optim),
        micro=tc.batch_size,
        accum=1,
        world_size=1,
        device=device,
        autocast=autocast_for(device, tc.dtype),
        z_loss=tc.z_loss,
        clip=cfg.optim.grad_clip,
        tokens_per_step=tc.batch_size * tc.seq_len,
    )
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.model.vocab_size, (tc.batch_size, tc.seq_len + 1), generator=gen)
    batch = (tokens[:, :-1], tokens[:, 1:])
    count = [0]

    def step():
        count[0] += 1
        return train_step(parts, batch, lr_at(min(count[0], tc.steps - 1), cfg.optim, tc.steps))

    return step


@contextlib.contextmanager
def clip_scope():
    """clip_grad_norm_ in a profiler scope of its own (train_step calls it via torch.nn.utils)."""
    clip = torch.nn.utils.clip_grad_norm_

    def scoped(*args, **kwargs):
        with torch.profiler.record_function("clip"):
            return clip(*args, **kwargs)

    with mock.patch.object(torch.nn.utils, "clip_grad_norm_", scoped):
        yield


def time_variants(steps: dict, variants: list[str], rounds: int, n: int) -> dict[str, list[float]]:
    """Seconds per step of each variant, one per round (n steps each, a fresh order each round)."""
    for name in variants:  # warm-up: first steps, allocator
        with VARIANTS[name]():
            for _ in range(3):
                steps[name]()
    times = {name: [] for name in variants}
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            with VARIANTS[name]():
                t0 = time.perf_counter()
                for _ in range(n):
                    steps[name]()
                times[name].append((time.perf_counter() - t0) / n)
    return times


def phase(event) -> str:
    """The phase an op ran in: its ancestors' scope (forward, clip, the optimizer) or backward."""
    e = event
    while e is not None:
        if e.name == "forward" or e.name == "clip":
            return e.name
        if e.name.startswith("Optimizer.step"):
            return "optimizer"
        if e.name.startswith("autograd::engine") or "Backward" in e.name:
            return "backward"
        e = e.cpu_parent
    return "other (lr, loss sync, zero_grad)"


def profile(step, n: int) -> tuple[dict, dict, float]:
    """Self CPU seconds per phase and per op family over n steps, and op calls per step."""
    with (
        clip_scope(),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
    ):
        for _ in range(n):
            step()
    phases, families, calls = defaultdict(float), defaultdict(float), 0
    for e in prof.events():
        if e.name in ("forward", "clip") or e.name.startswith(("Optimizer.", "autograd::engine")):
            continue  # scopes: their own time is the Python and dispatch between the ops they hold
        calls += e.name.startswith(("aten::", "normlab::"))
        phases[phase(e)] += e.self_cpu_time_total / 1e6
        families[family(e.name)] += e.self_cpu_time_total / 1e6
    return phases, families, calls / n


def matmul_peak(cfg, threads: int) -> tuple[float, dict]:
    """The best float32 GFLOP/s of a few matmuls on these threads: the step's shapes (ffn, head, its
    attention bmm) and large ones (a core's peak); (best, {shape: GFLOP/s})."""
    torch.set_num_threads(threads)
    m, d, v = cfg.train.batch_size * cfg.train.seq_len, cfg.model.dim, cfg.model.vocab_size
    f, t = cfg.model.ffn_hidden_dim, cfg.train.seq_len
    bh, hd = cfg.train.batch_size * cfg.model.n_heads, cfg.model.head_dim
    shapes = {
        f"{m}x{d}x{v} (head)": ((m, d), (d, v)),
        f"{m}x{d}x{f} (ffn)": ((m, d), (d, f)),
        f"{bh}x{t}x{hd}x{t} (bmm)": ((bh, t, hd), (bh, hd, t)),
        "1024x1024x1024": ((1024, 1024), (1024, 1024)),
        "2048x2048x2048": ((2048, 2048), (2048, 2048)),
    }
    rates = {}
    for name, (sa, sb) in shapes.items():
        a, b = torch.randn(sa), torch.randn(sb)
        flops = 2 * math.prod(sa) * sb[-1]
        reps = max(3, int(2e9 / flops))
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.matmul(a, b)
            best = min(best, (time.perf_counter() - t0) / reps)
        rates[name] = flops / best / 1e9
    return max(rates.values()), rates


def spread(xs: list[float], fmt: str = ".2f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}..{max(xs):{fmt}})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="lab/studies/norm-placement-lr.yaml")
    p.add_argument("--threads", type=number(int, ">= 1"), default=1)
    p.add_argument("--rounds", type=number(int, ">= 1"), default=15)
    p.add_argument(
        "--steps", type=number(int, ">= 1"), default=5, help="steps per variant and round"
    )
    p.add_argument("--variant", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--breakdown", nargs="*", default=["current"], choices=list(VARIANTS))
    p.add_argument("--profile-steps", type=number(int, ">= 0"), default=5)
    p.add_argument("--save", default=None)
    p.add_argument("overrides", nargs="*", metavar="key=value")
    a = p.parse_args(argv)
    cfg = study_config(a.study, a.threads, a.overrides)
    a.cpu = tune_cpu(a.threads, cfg.train.malloc_tuning)  # as train.py: allocator, denormals
    args = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "bench.bench_step", *args])
    with SavedOutput(a.save, command):
        return report(a, cfg)


def report(a, cfg) -> int:
    tc, mc = cfg.train, cfg.model
    step_flops = flops_per_token(mc, tc.seq_len) * tc.batch_size * tc.seq_len
    peak, rates = matmul_peak(cfg, a.threads)
    print(
        f"\n## One training step (cpu, {a.threads} thread(s), {tc.dtype}, "
        f"batch {tc.batch_size}x{tc.seq_len}, dim {mc.dim}, {mc.n_layers} layers, "
        f"vocab {mc.vocab_size}, norm_impl {mc.norm_impl}, ops_impl {mc.ops_impl}; "
        f"{step_flops / 1e9:.2f} GFLOP a step; allocator: {a.cpu['allocator']}; "
        f"{a.rounds} alternating rounds of {a.steps} steps)\n"
    )
    print(
        "Matmul peak (float32, best of 5): "
        + ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
        + f" GFLOP/s; peak = {peak:.0f} GFLOP/s\n"
    )
    steps = {}
    for name in a.variant:
        with VARIANTS[name]():
            steps[name] = make_step(cfg)
    times = time_variants(steps, a.variant, a.rounds, a.steps)
    first = a.variant[0]
    print(
        f"| variant | ms per step: median (min..max) | GFLOP/s | of peak "
        f"| speed vs {first}: median (min..max) |"
    )
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        ratios = [b / t for t, b in zip(ts, times[first], strict=True)]
        rate = step_flops / statistics.median(ts) / 1e9
        print(
            f"| {name} | {spread([t * 1e3 for t in ts], '.1f')} | {rate:.1f} | {rate / peak:.0%} | "
            f"{spread(ratios)} |"
        )
    for name in a.breakdown:
        with VARIANTS[name]():
            phases, families, calls = profile(make_step(cfg), a.profile_steps)
        total = sum(phases.values())
        print(
            f"\n### Where the step goes: {name} (torch.profiler, {a.profile_steps} steps, "
            f"self CPU time; {calls:.0f} op calls a step)\n"
        )
        print("| phase | share |\n|---|---|")
        for k, v in sorted(phases.items(), key=lambda kv: -kv[1]):
            print(f"| {k} | {v / total:.1%} |")
        print("\n| op family | share |\n|---|---|")
        for k, v in sorted(families.items(), key=lambda kv: -kv[1]):
            print(f"| {k} | {v / total:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
