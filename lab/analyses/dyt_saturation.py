"""DyT's saturation step by step on the DyT study's model (lab/studies/dyt.yaml's overrides): at
chosen steps, the residual stream's RMS after the last block, the fraction of the final DyT's units
with |alpha x| >= 9, the largest |gradient| below the final norm (grad/absmax/trunk; 0.0: the
dead-gradient state) and which parameters still get one, and the val loss. One run per --init-scale,
in-process, through train.py's own step (training/step.py) and probe; a step's row is the state
after that many updates, its gradient the next batch's.

    python lab/analyses/dyt_saturation.py                  # absolute and width init, lr 3e-3
    python lab/analyses/dyt_saturation.py --init-scale absolute --lr 1e-2 --at 0 20 50
    python lab/analyses/dyt_saturation.py model.init_head_std=0.16  # any config field, as train.py

Prints one markdown table (a row per run and step).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from data.loader import BatchLoader, load_tokens
from data.prepare import prepare
from lab.studyfile import flatten, load_study
from model import Llama
from normlab.layout import normlab_layout
from normlab.probe import StabilityProbe
from training import distributed
from training.config import load_config, number
from training.evaluate import evaluate
from training.optim import build_optimizer, lr_at
from training.step import StepParts, autocast_for, no_clip, train_step

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "lab" / "studies" / "dyt.yaml"


class GradProbe(StabilityProbe):
    """The stability probe, also keeping each parameter's largest |gradient| (before clipping)."""

    def record_grads(self) -> None:
        super().record_grads()
        self.absmax = {
            n: (p.grad.abs().max().item() if p.grad is not None else 0.0)
            for n, p in self.model.named_parameters()
        }


def study_overrides() -> list[str]:
    """The DyT study's model / data / optim / train overrides, as key=value."""
    return flatten(load_study(STUDY).overrides)


def run(
    init_scale: str,
    lr: float,
    seed: int,
    steps: int,
    at: list[int],
    extra: list[str],
    data_root: str,
    threads: int,
) -> list[dict]:
    cfg = load_config(
        REPO / "configs" / "train" / "default.yaml",
        [
            *study_overrides(),
            "model.norm=dyt",
            "model.embed_scale=sqrt_dim",
            f"model.init_scale={init_scale}",
            f"optim.lr={lr}",
            f"train.seed={seed}",
            f"train.steps={steps}",
            f"data.root={data_root}",
            *extra,
        ],
    )
    torch.set_num_threads(threads)
    d = distributed.setup("cpu")
    prepared = prepare(**vars(cfg.data), verbose=False)
    tc = cfg.train
    loader = BatchLoader(load_tokens(prepared, "train"), tc.seq_len, tc.batch_size, tc.seed)
    val = load_tokens(prepared, "val")
    torch.manual_seed(tc.seed)
    model = Llama(cfg.model)
    opt = build_optimizer(model, cfg.optim)
    autocast = autocast_for(d.device, tc.dtype)
    parts = StepParts(
        model=model,
        ddp=model,
        compiled=model,
        opt=opt,
        micro=tc.batch_size,
        accum=1,
        world_size=1,
        device=d.device,
        autocast=autocast,
        z_loss=tc.z_loss,
        clip=no_clip(cfg.optim.grad_clip),
        tokens_per_step=tc.batch_size * tc.seq_len,
    )
    last = f"layer_{cfg.model.n_layers - 1}"
    rows = []
    for step in range(max(at) + 1):
        # the state after `step` updates: the next step's forward and backward, no update; an eval
        if step in at:
            probe = GradProbe(model, layout=normlab_layout(model))
            probe.attach()
            x, y = loader.batch(step)  # the batch the next update would take
            logits, loss = model(x, y)
            probe.record_logits(logits)
            loss.backward()
            probe.record_grads()
            opt.zero_grad(set_to_none=True)
            m = probe.finish()
            trunk = {n: v for n, v in probe.absmax.items() if not n.startswith("output.")}
            live = sorted(n for n, v in trunk.items() if v != 0.0)
            val_loss = evaluate(model, val, cfg, d, autocast, tc.batch_size)["val/loss"]
            rows.append(
                {
                    "init": init_scale,
                    "lr": lr,
                    "step": step,
                    "stream_rms": m[f"act/rms/{last}"],
                    "final_saturated": m.get("dyt/saturated/final", math.nan),
                    "trunk_absmax": m["grad/absmax/trunk"],
                    "live": live,
                    "val": val_loss,
                }
            )
        if step < max(at):
            train_step(
                parts, next(loader), lr_at(step, cfg.optim, cfg.optim.schedule_steps or tc.steps)
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--init-scale", nargs="+", default=["absolute", "width"], help="model.init_scale values"
    )
    p.add_argument("--lr", type=number(float, "> 0"), default=3e-3)
    p.add_argument("--seed", type=number(int, ">= 0"), default=0)
    p.add_argument(
        "--steps",
        type=number(int, ">= 1"),
        default=300,
        help="train.steps: the LR schedule's horizon (the study's)",
    )
    p.add_argument(
        "--at",
        type=number(int, ">= 0"),
        nargs="+",
        default=[0, 10, 20, 30, 50, 100],
        help="steps to measure after",
    )
    p.add_argument("--data-root", default="data/prepared")
    p.add_argument("--threads", type=number(int, ">= 1"), default=1)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any config field")
    a = p.parse_intermixed_args(argv)
    print(
        "| init | lr | step | stream RMS (last block) | final DyT saturated | grad/absmax/trunk | "
        "parameters with a nonzero gradient, the head's left out | val loss |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for scale in a.init_scale:
        for r in run(
            scale, a.lr, a.seed, a.steps, sorted(a.at), a.overrides, a.data_root, a.threads
        ):
            live = "all" if len(r["live"]) > 10 else ", ".join(r["live"]) or "none"
            print(
                f"| {r['init']} | {r['lr']:g} | {r['step']} | {r['stream_rms']:.3g} | "
                f"{r['final_saturated']:.1%} | "
                f"{r['trunk_absmax']:.3g} | {live} ({len(r['live'])}) | {r['val']:.3f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
