"""The library monitor's cost in a plain loop: a step with no monitor, the same step probed (every
step), and the monitor at its default cadence (amortized: one probed step in 25), on normlab's
default model and on a transformers LlamaForCausalLM of the same shape.

    python -m bench.bench_monitor [--steps 50] [--rounds 5] [--threads 2] [--save FILE]

Each round runs every mode for the same steps, alternating modes round by round so that machine
noise hits all of them alike; a mode's time is its steps' wall time (forward, backward, clip,
AdamW, the loss read back as a float, as a loop that logs it does). Prints each mode's time over
the unmonitored one: median over rounds and the min..max spread."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from bench.benchlib import SavedOutput
from model import Llama
from normlab import Monitor
from training.config import load_config, number


def normlab_model(cfg):
    torch.manual_seed(0)
    return Llama(cfg.model)


def hf_llama(cfg):
    """transformers' Llama with the default model's shape (its vocabulary, width, depth, heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    m = cfg.model
    probe = Llama(m)
    hidden = probe.layers[0].feed_forward.w1.out_features
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=m.vocab_size,
            hidden_size=m.dim,
            intermediate_size=hidden,
            num_hidden_layers=m.n_layers,
            num_attention_heads=m.n_heads,
            num_key_value_heads=m.n_kv_heads or m.n_heads,
            max_position_embeddings=m.max_seq_len,
            tie_word_embeddings=m.tie_embeddings,
        )
    )


def loss_of(model, x, y):
    if isinstance(model, Llama):
        return model(x, y)[1]
    return model(input_ids=x, labels=x).loss


def timed(model, batches, every: int | None, folder: str) -> float:
    """Wall seconds of the loop over `batches` (steps 2..: a cadence of 25 probes 2 in 50)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    monitor = Monitor(model, folder, every=every, tensorboard=False) if every else None
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches, start=2):
        if monitor is not None:
            monitor.start(step)
        loss = loss_of(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().item()
        if monitor is not None:
            monitor.log(loss=value)
            monitor.end()
    elapsed = time.perf_counter() - t0
    if monitor is not None:
        monitor.close()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=number(int, ">= 2"), default=50)
    p.add_argument("--rounds", type=number(int, ">= 1"), default=5)
    p.add_argument("--threads", type=number(int, ">= 1"), default=2)
    p.add_argument("--save", default=None, help="also write the table to this file")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the default config")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = load_config(None, a.overrides)
    tc = cfg.train
    gen = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, cfg.model.vocab_size, (2, tc.batch_size, tc.seq_len), generator=gen)
        for _ in range(a.steps)
    ]
    modes = {"unmonitored": None, "every step": 1, "every 25 (default)": 25}
    command = "python -m bench.bench_monitor " + " ".join(sys.argv[1:] if argv is None else argv)
    with SavedOutput(a.save, command):
        return table(a, cfg, batches, modes)


def table(a, cfg, batches, modes) -> int:
    tc = cfg.train
    print(
        f"Monitor overhead ({a.rounds} alternating rounds of {a.steps} steps, "
        f"{tc.batch_size}x{tc.seq_len} tokens a step, {a.threads} threads)\n"
    )
    print("| model | mode | s/step (median) | ratio to unmonitored: median | min..max |")
    print("|---|---|---|---|---|")
    for label, build in (("normlab default", normlab_model), ("transformers Llama", hf_llama)):
        model = build(cfg)
        timed(model, [(b[0], b[1]) for b in batches[:3]], None, "")  # warm-up
        times: dict[str, list[float]] = {m: [] for m in modes}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(a.rounds):
                order = list(modes) if r % 2 == 0 else list(reversed(modes))
                for mode in order:
                    folder = f"{tmp}/{r}-{modes[mode]}"
                    times[mode].append(
                        timed(model, [(b[0], b[1]) for b in batches], modes[mode], folder)
                    )
        for mode, ts in times.items():
            ratios = [t / base for t, base in zip(ts, times["unmonitored"], strict=True)]
            print(
                f"| {label} | {mode} | {statistics.median(ts) / a.steps:.4f} | "
                f"{statistics.median(ratios):.3f} | {min(ratios):.3f}..{max(ratios):.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
