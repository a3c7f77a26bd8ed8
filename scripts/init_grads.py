"""Per-layer gradient norm at initialization vs layer index, for every placement and norm, at several depths, under
the default init and a Xiong-style one: the analogue of Xiong et al. (2020), Fig. 3. No training; seconds.

    python scripts/init_grads.py                         # depths 2..32, prints a table, writes the figure
    python scripts/init_grads.py --depths 2 4 --dim 32 --out /tmp/ig

Inits: `default` is this repo's (N(0, 0.02^2), residual projections / sqrt(2 L), GPT-2); `xiong` is plain
N(0, 1/d) for every matrix and the embedding with no residual scaling (Xavier-like, as in Xiong et al.'s
Post-LN analysis). The loss is the next-token loss of a fixed batch of uniform random tokens (seeded), so the
numbers depend on the architecture and init alone. Gradient norm of a layer = L2 norm over its weight matrices.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from model import Llama, ModelArgs
from model.blocks import BLOCKS

INITS = {"default": lambda dim: {}, "xiong": lambda dim: {"init_std": dim ** -0.5, "init_residual": "plain",
                                                          "init_embedding_std": dim ** -0.5}}
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("docs/results/init-grads"))
    a = p.parse_args(argv)
    if a.dim % 4 or min(a.depths) < 1:
        print("error: --dim must be a multiple of 4 (4 heads) and --depths >= 1", file=sys.stderr)
        return 2
    results = {}
    for init, extra in INITS.items():
        for placement, norm in ARMS:
            for depth in a.depths:
                args = ModelArgs(dim=a.dim, n_layers=depth, n_heads=4, n_kv_heads=2, vocab_size=256,
                                 max_seq_len=a.seq, norm=norm, placement=placement, **extra(a.dim))
                results[init, placement, norm, depth] = layer_grad_norms(args, a.batch, a.seq)
    print("| init | placement | norm | depth | grad norm, first layer | last layer | last / first |")
    print("|---|---|---|---|---|---|---|")
    for (init, placement, norm, depth), g in results.items():
        print(f"| {init} | {placement} | {norm} | {depth} | {g[0]:.3e} | {g[-1]:.3e} | {g[-1] / g[0]:.2f} |")
    a.out.mkdir(parents=True, exist_ok=True)
    figure(results, a.depths, a.out / "init_grads.png")
    print(f"figure: {a.out / 'init_grads.png'}")
    return 0


def figure(results: dict, depths: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(INITS), len(ARMS), figsize=(2.6 * len(ARMS), 2.6 * len(INITS)), squeeze=False,
                             sharey="row")
    colors = {d: plt.cm.viridis(i / max(1, len(depths) - 1)) for i, d in enumerate(depths)}
    for row, init in enumerate(INITS):
        for col, (placement, norm) in enumerate(ARMS):
            ax = axes[row][col]
            for depth in depths:
                g = results[init, placement, norm, depth]
                ax.plot(range(1, len(g) + 1), g, marker=".", color=colors[depth], label=f"{depth} layers")
            ax.set_yscale("log")
            ax.set_title(f"{init}: {placement} {norm}", fontsize=8)
            ax.set_xlabel("layer", fontsize=8)
    axes[0][0].set_ylabel("grad norm at init")
    axes[1][0].set_ylabel("grad norm at init")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
