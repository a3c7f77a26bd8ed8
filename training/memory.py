"""Will the run fit? A memory estimate from the config, checked against what the machine has before
the run starts: a run too big for it used to train for minutes towards the OOM killer (or an
allocation failure's traceback).

The estimate, per process (bytes; the terms measured on torch 2.13's CPU build):
- the process itself: what it holds when checked (torch, the libraries) plus RUNTIME for what loads
  later (the fused kernels, the data's pages);
- training state: float32 parameters, gradients and AdamW's two moments (16 bytes a parameter),
  divided over the ranks that shard them (fsdp, tp); DDP's gradient buckets (4 bytes a parameter); a
  block's gathered parameters and gradients under FSDP; the probe's copy of the blocks' parameters
  on the steps it observes;
- activations of one micro-batch (micro_batch_size x seq_len tokens), saved for the backward pass:
  per token and block 7 dim + 3 ffn hidden + 3 kv dim floats (+ 2 dim for qk-norm, + 2 dim for a
  peri block's output norms), measured with autograd's saved-tensor hooks; with attention
  soft-capping (explicit attention) 2 x heads x seq_len more for its capped logits and softmax
  weights, 2 dim for the keys and values repeated per head; the head's logits and their gradient (2
  vocab floats a token, 3 with the reference cross-entropy); under tensor parallelism a rank holds
  its heads' and hidden units' share and the full-width inputs it gathers. Backward and glibc's heap
  (training/cpu.py keeps freed memory) add FRAGMENTATION;
- the stability probe's attention-logit max and entropy, on the steps it observes: a block of at
  most MAX_SCORES scores (as many whole sequences as that holds, or query rows of one), four alive
  at once (the scores, capped, softmax weights, x log x), and its causal masks;
- evaluation (no gradients): a micro-batch's logits, their float32 copy and log-softmax.
On CUDA the training state and activations live on the GPU and are checked against its free memory
instead.

Measured peak RSS / estimate (/usr/bin/time -v, 2 steps with the probe's first step and an eval,
qk_stats with attention entropy): 0.89 (tiny.yaml), 1.06 (default.yaml), 0.97 (default.yaml at
seq_len 1024), 0.65 (tiny at seq_len 4096: the probe's blocks and the activations are counted as if
alive together). The check compares the estimate with all that is available: a run that fits by a
few percent may still not."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path

import torch

from normlab.attention import MAX_SCORES
from training.config import Config, ConfigError

GiB = 1 << 30
# loaded after the check: the fused kernels, the data's touched pages, the progress bar
RUNTIME = 64 << 20
FRAGMENTATION = (
    1.3  # peak RSS over live tensors: glibc's heap keeps freed blocks (measured 1.2-1.35)
)
CUDA_CONTEXT = 1 << 30  # the CUDA context, cuBLAS workspaces and the caching allocator's slack


@dataclass
class Estimate:
    """A run's peak memory per process, by part (bytes)."""

    parts: dict[str, float] = field(default_factory=dict)
    device: str = "cpu"  # where the training state and activations live

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def say(self) -> str:
        big = sorted(
            ((v, k) for k, v in self.parts.items() if v >= 0.05 * self.total), reverse=True
        )
        return ", ".join(f"{k} {_gib(v)}" for v, k in big)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= 0.1 * GiB else f"{n / (1 << 20):.0f} MiB"


def parameters(cfg: Config) -> tuple[int, int]:
    """(parameters of the model, the largest block's), counted on a model built on the meta device
    (no memory)."""
    from model import Llama

    with torch.device("meta"):
        model = Llama(cfg.model)
    block = max(sum(p.numel() for p in b.parameters()) for b in model.layers)
    return model.num_params(), block


def estimate(
    cfg: Config,
    world: int,
    data_world: int,
    micro: int,
    device: str = "cpu",
    params: tuple[int, int] | None = None,
    process: float = 0.0,
    seq_len: int | None = None,
) -> Estimate:
    """The peak memory of one process of this run (see the module docstring); seq_len / micro
    replace the config's (to find the largest that fits). `process`: what the process holds already
    (its RSS, on CPU)."""
    a, t = cfg.model, cfg.train
    T = seq_len or t.seq_len
    P, block = params or parameters(cfg)
    sharded = world > 1 and t.parallel in ("fsdp", "tp")
    tp = t.tp_size if world > 1 and t.parallel == "tp" else 1
    d, f, kvd, H = a.dim, a.ffn_hidden_dim, a.kv_heads * a.head_dim, a.n_heads
    low = t.dtype != "float32"

    state = 16.0 * P / (world if sharded else 1)
    state += 4.0 * P if world > 1 and t.parallel == "ddp" else 0.0  # DDP's gradient buckets
    # a block gathered, its gradients before the reduce-scatter
    state += 8.0 * block if sharded else 0.0
    state += 2.0 * P / (world if sharded else 1) if low else 0.0  # autocast's cast weights
    probe_on = cfg.log.stats_every > 0
    snapshot = (
        4.0 * (P - a.vocab_size * d * (1 if a.tie_embeddings else 2)) / (world if sharded else 1)
    )

    tokens = micro * T
    layer = 7 * d + 3 * f + 3 * kvd + (2 * d if a.qk_norm != "none" else 0)
    layer += 2 * d if a.placement == "peri" else 0
    layer += 2 * d if a.attn_gate != "none" else 0  # the gate's logits and sigmoid
    layer += kvd if a.placement in ("hybrid", "hybridstar") else 0  # the normalized values
    # explicit attention (model/layers.py): its capped logits and softmax weights, T per head each
    if a.attn_softcap:
        layer += 2 * H * T + 2 * d  # and the keys and values repeated to every query head
    # its heads and hidden units; the gathered full-width inputs of attention and feed-forward
    if tp > 1:
        layer = layer / tp + 2 * d
    head = (3 if a.ops_impl == "reference" else 2) * a.vocab_size + 3 * d
    activations = FRAGMENTATION * 4.0 * tokens * (a.n_layers * layer + head)
    probe = 0.0
    # normlab.attention.qk_stats: blocks of <= MAX_SCORES scores (whole sequences, or query rows)
    if probe_on:
        heads = H // tp
        rows = max(1, min(T, MAX_SCORES // (heads * T)))
        block = (
            min(micro, max(1, MAX_SCORES // (heads * T * T))) * heads * T * T
            if rows == T
            else heads * rows * T
        )
        # scores, capped, weights, x log x
        probe = FRAGMENTATION * (4 * 4.0 * block + 2.0 * rows * T) + snapshot
    evaluation = FRAGMENTATION * 4.0 * tokens * (3 * a.vocab_size + 4 * d + f)

    parts = {"process": process + RUNTIME if device == "cpu" else 0.0, "training state": state}
    parts.update(
        {"activations": activations, "the probe": probe}
        if activations + probe >= evaluation
        else {"evaluation": evaluation}
    )
    if device == "cuda":
        parts["CUDA context"] = CUDA_CONTEXT
    return Estimate(parts, device)


def _status(key: str) -> float | None:
    """A field of /proc/self/status in bytes (VmRSS, VmSize), None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available() -> tuple[float, str] | None:
    """(bytes this machine can still give, where that number comes from): the least of MemAvailable
    and a cgroup's limit less its usage; None when neither can be read."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((float(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
    except OSError:
        pass
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (v1 + "limit_in_bytes", v1 + "usage_in_bytes"),
    ):
        try:
            cap = Path(limit).read_text().strip()
            if cap != "max" and float(cap) < 1 << 60:
                found.append(
                    (float(cap) - float(Path(usage).read_text()), f"the cgroup's limit ({limit})")
                )
        except (OSError, ValueError):
            pass
    return min(found) if found else None


def address_space_left() -> float | None:
    """Bytes of address space this process may still map under `ulimit -v` (RLIMIT_AS), None when
    unlimited."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    size = _status("VmSize")
    return None if limit == resource.RLIM_INFINITY or size is None else limit - size


def check(
    cfg: Config, world: int, data_world: int, micro: int, local_world: int, device: torch.device
) -> Estimate:
    """The estimate, or ConfigError when it does not fit this machine: the need, what is available,
    the largest seq_len and micro-batch that fit."""
    params = parameters(cfg)
    rss = _status("VmRSS") or 0.0
    kind = device.type
    est = estimate(cfg, world, data_world, micro, kind, params, rss)
    if not cfg.train.memory_check:
        return est
    if kind == "cuda":
        free = float(torch.cuda.mem_get_info(device)[0])
        room, source, need = free, f"free on {torch.cuda.get_device_name(device)}", est.total
        fits = lambda e: e.total <= free  # noqa: E731
        share = ""
    else:
        have = available()
        left = address_space_left()
        if have is None and left is None:
            return est
        per_process = lambda e: max(0.0, e.total - rss)  # noqa: E731  (what it holds is already counted)
        limits = []
        if have is not None:
            limits.append((have[0] / local_world, have[1]))
        if left is not None:
            limits.append((left, "the address-space limit (ulimit -v)"))
        room, source = min(limits)
        need = per_process(est)
        fits = lambda e: per_process(e) <= room  # noqa: E731
        share = (
            f" for each of the {local_world} processes on this machine" if local_world > 1 else ""
        )
    if need <= room:
        return est
    raise ConfigError(
        f"this run needs ~{_gib(need)} more memory per process ({est.say()}) but {_gib(room)} is "
        f"available{share} ({source}); "
        f"{_largest(cfg, world, data_world, micro, kind, params, rss, fits)}"
        f" (train.memory_check=false skips this check)"
    )


def _largest(
    cfg: Config, world: int, data_world: int, micro: int, kind: str, params, rss, fits
) -> str:
    """What fits instead: the largest seq_len at this micro-batch, the largest micro-batch at this
    seq_len."""
    t = cfg.train
    step = t.tp_size if world > 1 and t.parallel == "tp" else 1
    at = lambda s, m: estimate(cfg, world, data_world, m, kind, params, rss, seq_len=s)  # noqa: E731
    lo, hi = 0, t.seq_len // step  # in units of `step`: the largest n with seq_len n * step fitting
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(at(mid * step, micro)) else (lo, mid - 1)
    says = [
        f"train.seq_len={lo * step} fits at {micro} sequences per micro-batch"
        if lo
        else f"not even train.seq_len={step} fits at {micro} sequences per micro-batch"
    ]
    per_rank = t.batch_size // data_world
    smaller = [m for m in range(micro - 1, 0, -1) if per_rank % m == 0]
    best = next((m for m in smaller if fits(at(t.seq_len, m))), None)
    if best:
        says.append(f"train.micro_batch_size={best} at train.seq_len={t.seq_len}")
    elif smaller:
        says.append(f"no micro-batch fits at train.seq_len={t.seq_len}")
    return "the largest that fits: " + ", or ".join(says)


def describe(est: Estimate) -> dict:
    """For meta.json: the estimate by part, in bytes."""
    return {
        "estimate": round(est.total),
        "parts": {k: round(v) for k, v in est.parts.items()},
        "device": est.device,
    }
