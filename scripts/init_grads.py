"""Per-layer gradient norm at initialization vs layer index, for every placement and norm, at several depths and
seeds, under the default init and a Xiong-style one, with LLaMA's SwiGLU and with the original Transformer's ReLU
feed-forward: the analogue of Xiong et al. (2020), Fig. 3. No training.

    python scripts/init_grads.py                         # prints the table, writes report.md, report.json, figure
    python scripts/init_grads.py --depths 2 4 --dim 32 --seeds 0 --out /tmp/ig

Settings: `default` is this repo's model (SwiGLU; N(0, 0.02^2), residual projections / sqrt(2 L), GPT-2);
`xiong` uses N(0, 1/d) for every matrix and the embedding with no residual scaling (Xavier-like, as in Xiong et
al.'s Post-LN analysis); `xiong-relu` is that init with the ReLU feed-forward Xiong et al. analyse. The loss is
the next-token loss of a batch of uniform random tokens, so the numbers depend on the architecture, init and seed
alone. Gradient norm of a layer = L2 norm over its weight matrices; a seed draws both the weights and the batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from model import Llama, ModelArgs
from model.blocks import BLOCKS


def _xiong(dim: int) -> dict:
    return {"init_std": dim ** -0.5, "init_residual": "plain", "init_embedding_std": dim ** -0.5}


SETTINGS = {"default": lambda dim: {}, "xiong": _xiong, "xiong-relu": lambda dim: {**_xiong(dim), "ffn": "relu"}}
ARMS = [(placement, norm) for placement in BLOCKS for norm in ("rmsnorm", "layernorm")] + [("pre", "none")]


def layer_grad_norms(args: ModelArgs, batch: int, seq: int, seed: int = 0) -> list[float]:
    """The gradient norm of each block's matrices for one backward pass at initialization."""
    torch.manual_seed(seed)
    model = Llama(args)
    gen = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, args.vocab_size, (batch, seq + 1), generator=gen)
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return [torch.linalg.vector_norm(torch.stack([m.weight.grad.norm() for m in layer.modules()
                                                  if isinstance(m, torch.nn.Linear)])).item()
            for layer in model.layers]


def direction(ratios: list[float]) -> str:
    """How the gradient norm goes from the first to the last layer over seeds: flat when every seed is within
    1.5x, else rises / falls when every seed goes the same way (the range says by how much), else seeds disagree."""
    if any(r != r for r in ratios):
        return "not finite"
    if all(1 / 1.5 <= r <= 1.5 for r in ratios):
        return "flat (within 1.5x)"
    if all(r > 1 for r in ratios):
        return "rises with layer index"
    if all(r < 1 for r in ratios):
        return "falls with layer index"
    return "seeds disagree"


def findings(results: dict, seeds: list[int], depth: int) -> list[str]:
    """One sentence per setting and placement at the deepest depth: last / first layer per seed and its direction
    (Xiong et al. 2020, Fig. 3: Post-LN rises with layer index, Pre-LN is flat)."""
    out = []
    for setting in SETTINGS:
        parts = []
        for placement, norm in ARMS:
            ratios = [results[setting, placement, norm, depth, s][-1] / results[setting, placement, norm, depth, s][0]
                      for s in seeds]
            parts.append(f"{placement} {norm} {direction(ratios)} (last / first {_range(ratios)})")
        out.append(f"`{setting}`, {depth} layers, n = {len(seeds)} seeds: " + "; ".join(parts) + ".")
    return out


def _range(xs: list[float]) -> str:
    return f"{min(xs):.3g}..{max(xs):.3g}" if len(xs) > 1 else f"{xs[0]:.3g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depths", type=int, nargs="+", default=[2, 8, 24])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("docs/results/init-grads"))
    a = p.parse_args(argv)
    if a.dim % 4 or min(a.depths) < 1:
        print("error: --dim must be a multiple of 4 (4 heads) and --depths >= 1", file=sys.stderr)
        return 2
    results = {}
    for setting, extra in SETTINGS.items():
        for placement, norm in ARMS:
            for depth in a.depths:
                args = ModelArgs(dim=a.dim, n_layers=depth, n_heads=4, n_kv_heads=2, vocab_size=256,
                                 max_seq_len=a.seq, norm=norm, placement=placement, **extra(a.dim))
                for seed in a.seeds:
                    results[setting, placement, norm, depth, seed] = layer_grad_norms(args, a.batch, a.seq, seed)
    table = ["| setting | placement | norm | depth | grad norm, first layer | last layer | last / first, per seed |",
             "|---|---|---|---|---|---|---|"]
    for setting in SETTINGS:
        for placement, norm in ARMS:
            for depth in a.depths:
                g = [results[setting, placement, norm, depth, s] for s in a.seeds]
                table.append(f"| {setting} | {placement} | {norm} | {depth} | {statistics.fmean(x[0] for x in g):.3e} "
                             f"| {statistics.fmean(x[-1] for x in g):.3e} | "
                             f"{', '.join(f'{x[-1] / x[0]:.3g}' for x in g)} |")
    print("\n".join(table))
    a.out.mkdir(parents=True, exist_ok=True)
    figure(results, a.depths, a.seeds, a.out / "init_grads.png")
    said = findings(results, a.seeds, max(a.depths))
    about = __doc__.split("\n\n")[0].replace("\n", " ")
    (a.out / "report.md").write_text("\n".join([
        "# Per-layer gradient norm at initialization", "", about, "",
        f"`python scripts/init_grads.py --depths {' '.join(map(str, a.depths))} --seeds "
        f"{' '.join(map(str, a.seeds))} --dim {a.dim} --batch {a.batch} --seq {a.seq}`", "",
        __doc__.split("\n\n")[2].replace("\n", " "), "", "## What the numbers show", "",
        *[f"- {s}" for s in said], "", "![per-layer gradient norm at init](init_grads.png)", "", *table, ""]))
    (a.out / "report.json").write_text(json.dumps({
        "name": "init-grads", "about": about, "runs": len(results), "findings": said,
        "grad_norms": {"/".join(map(str, k)): v for k, v in results.items()}}, indent=1) + "\n")
    print(f"report: {a.out / 'report.md'}")
    return 0


def figure(results: dict, depths: list[int], seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(SETTINGS), len(ARMS), figsize=(2.4 * len(ARMS), 2.4 * len(SETTINGS)),
                             squeeze=False)  # each panel its own log scale: the no-norm arm reaches 1e15
    colors = {d: plt.cm.viridis(i / max(1, len(depths) - 1)) for i, d in enumerate(depths)}
    for row, setting in enumerate(SETTINGS):
        for col, (placement, norm) in enumerate(ARMS):
            ax = axes[row][col]
            for depth in depths:
                for i, seed in enumerate(seeds):  # every seed drawn
                    g = results[setting, placement, norm, depth, seed]
                    ax.plot(range(1, len(g) + 1), g, marker=".", ms=3, lw=0.8, color=colors[depth],
                            label=f"{depth} layers" if i == 0 else None)
            ax.set_yscale("log")
            ax.set_title(f"{setting}: {placement} {norm}", fontsize=7)
            ax.set_xlabel("layer", fontsize=7)
        axes[row][0].set_ylabel("grad norm at init")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
