"""Per-layer gradient norm at initialization vs layer index, for every placement and norm, at
several depths and seeds, under the default init and a Xiong-style one with each feed-forward (ReLU,
GELU, ReLU^2, SwiGLU): the analogue of Xiong et al. (2020), Fig. 3, with the trend as a fitted slope
and its CI over seeds, and each block's Jacobian gain measured directly. No training.

    python lab/analyses/init_grads.py  # prints the table; writes report.md, report.json, figures
    python lab/analyses/init_grads.py --depths 2 4 --dim 32 --seeds 0 1 --out /tmp/ig

Settings: `default` is this repo's model (SwiGLU; N(0, 0.02^2), residual projections / sqrt(2 L),
GPT-2); `xiong-FFN` uses N(0, 1/d) for every matrix and the embedding with no residual scaling
(Xavier-like, as in Xiong et al.'s Post-LN analysis) with feed-forward FFN: relu (the original
Transformer's, the one Xiong et al. analyse), gelu (smooth, degree 1 as ReLU), relu2 (ReLU squared,
Primer: degree 2 as SwiGLU, without its gate) and swiglu (LLaMA's). relu, gelu and relu2 have the
same matrices, so a seed draws the same weights for the three. The loss is the next-token loss of a
batch of uniform random tokens, so the numbers depend on the architecture, init and seed alone; a
seed draws both the weights and the batch.

Measures, per layer, from one backward pass: `W2`, the gradient norm of the feed-forward's second
matrix (feed_forward.w2, the matrix of Xiong et al.'s Fig. 3 and Theorem 1), and `all`, the L2 norm
over all the block's matrices. The trend of each is the OLS slope of log(grad norm) vs layer index,
fitted per seed; the verdict (rises / falls / flat) is decided by the 95% t CI of the mean slope
over seeds (flat: the CI contains 0). Seeds, not layers, are the independent unit: the layers of one
seed share its weights and batch, so a pooled fit over all layers would understate the CI. A slope
summarises the trend; it does not say the curve is monotone (the figures draw every seed). The
Jacobian gain of block l is the RMS of ||J v|| / ||v|| over random unit v (J the block's Jacobian at
the input it saw in that pass, by forward-mode JVP): sqrt of J's mean squared singular value, which
is also the RMS gain of J^T, the backward signal through the block. Above 1 the gradient grows on
its way down the stack (lower layers see larger gradients), below 1 it shrinks. Per seed its
geometric mean over blocks 2..L (block 1's input is the embedding, whose scale alone sets a norm's
gain there; the table gives it apart); the verdict (grows / shrinks / neither) by the 95% t CI over
seeds (neither: the CI contains 1)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from lab.paired import mean_ci
from model import Llama, ModelArgs
from model.blocks import BLOCKS
from model.ffn import FFNS
from training.config import number
from training.rundir import replacing, write_text


def _xiong(dim: int) -> dict:
    return {"init_std": dim**-0.5, "init_residual": "plain", "init_embedding_std": dim**-0.5}


SETTINGS = {
    "default": lambda dim: {},
    **{f"xiong-{ffn}": (lambda dim, ffn=ffn: {**_xiong(dim), "ffn": ffn}) for ffn in FFNS},
}
ARMS = [(placement, norm) for placement in BLOCKS for norm in ("rmsnorm", "layernorm")] + [
    ("pre", "none")
]
MEASURES = {"w2": "W2 grad norm (feed_forward.w2)", "all": "all-matrix grad norm"}
ABLATION_ARMS = [
    ("post", "rmsnorm"),
    ("post", "layernorm"),
    ("pre", "rmsnorm"),
    ("pre", "layernorm"),
]  # Xiong's two
PAIRED_FFNS = ("gelu", "relu2")  # vs relu: the same matrices, so the same weights per seed


def jacobian_gain(
    f, x: torch.Tensor, n_dirs: int, generator: torch.Generator | None = None
) -> float:
    """sqrt(mean over n_dirs random unit v of ||J v||^2 / ||v||^2), J = df/dx at x, by forward-mode
    JVP (torch.func.jvp, vectorised over the directions): an unbiased estimate of ||J||_F^2 /
    dim(x), the mean squared singular value, under the root. Attention runs its math kernel: the CPU
    flash kernel has no forward-mode derivative."""
    v = torch.randn((n_dirs, *x.shape), generator=generator, dtype=x.dtype)
    v = v / v.flatten(1).norm(dim=1).view(-1, *[1] * x.dim())
    with sdpa_kernel([SDPBackend.MATH]):
        jv = torch.func.vmap(lambda d: torch.func.jvp(f, (x,), (d,))[1])(v)
    return jv.flatten(1).norm(dim=1).square().mean().sqrt().item()


def measure(
    args: ModelArgs, batch: int, seq: int, seed: int = 0, jvp_dirs: int = 0
) -> dict[str, list[float]]:
    """Per layer, from one backward pass at initialization: 'all' (the gradient norm over the
    block's matrices), 'w2' (feed_forward.w2's), and with jvp_dirs > 0 'gain' (the block's Jacobian
    gain at the input it saw)."""
    torch.manual_seed(seed)
    model = Llama(args)
    gen = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, args.vocab_size, (batch, seq + 1), generator=gen)
    inputs = []
    hooks = (
        [layer.register_forward_pre_hook(lambda _, a: inputs.append(a)) for layer in model.layers]
        if jvp_dirs
        else []
    )
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    for h in hooks:
        h.remove()
    out = {
        "all": [
            torch.linalg.vector_norm(
                torch.stack(
                    [
                        m.weight.grad.norm()
                        for m in layer.modules()
                        if isinstance(m, torch.nn.Linear)
                    ]
                )
            ).item()
            for layer in model.layers
        ],
        "w2": [layer.feed_forward.w2.weight.grad.norm().item() for layer in model.layers],
    }
    if jvp_dirs:
        gen_v = torch.Generator().manual_seed(seed + 2)
        out["gain"] = [
            jacobian_gain(
                lambda h, layer=layer, rope=rope: layer(h, rope), x.detach(), jvp_dirs, gen_v
            )
            for layer, (x, rope) in zip(model.layers, inputs, strict=True)
        ]
    return out


def log_slope(ys: list[float]) -> float:
    """OLS slope of log(y) vs index 1..len(ys) (per layer)."""
    xs = range(1, len(ys) + 1)
    return statistics.linear_regression(xs, [math.log(y) for y in ys]).slope


def _usable(ys: list[float]) -> bool:
    return all(math.isfinite(y) and y > 0 for y in ys)


def trend(per_seed: list[list[float]]) -> dict:
    """The per-layer trend over seeds: each seed's OLS slope of log(grad norm) vs layer, their mean
    and 95% t CI, and the verdict the CI decides (flat when it contains 0). Not finite when any seed
    has a non-finite or zero norm (no slope is fitted to the rest)."""
    bad = sum(not _usable(ys) for ys in per_seed)
    if bad:
        return {
            "n": len(per_seed),
            "not_finite": bad,
            "slope": None,
            "ci": None,
            "verdict": "not finite",
        }
    slope, ci = mean_ci([log_slope(ys) for ys in per_seed])
    verdict = "no CI" if ci is None else "rises" if ci[0] > 0 else "falls" if ci[1] < 0 else "flat"
    return {"n": len(per_seed), "not_finite": 0, "slope": slope, "ci": ci, "verdict": verdict}


def gain_summary(per_seed: list[list[float]]) -> dict:
    """The Jacobian gain per block over seeds: each seed's geometric mean over blocks 2..L (block
    1's input is the embedding, whose scale alone sets a norm's gain there: reported apart), their
    geometric mean and 95% t CI (on logs), and the verdict the CI decides (neither when it contains
    1)."""
    bad = sum(not _usable(g[1:]) for g in per_seed)
    if bad:
        return {
            "n": len(per_seed),
            "not_finite": bad,
            "gain": None,
            "ci": None,
            "verdict": "not finite",
        }
    m, ci = mean_ci([statistics.fmean(math.log(x) for x in g[1:]) for g in per_seed])
    verdict = (
        "no CI" if ci is None else "grows" if ci[0] > 0 else "shrinks" if ci[1] < 0 else "neither"
    )
    return {
        "n": len(per_seed),
        "not_finite": 0,
        "gain": math.exp(m),
        "ci": ci and (math.exp(ci[0]), math.exp(ci[1])),
        "verdict": verdict,
    }


def paired_slope_difference(a: list[list[float]], b: list[list[float]]) -> dict:
    """Per seed, the slope of a minus the slope of b (the same seeds, in order), their mean and 95%
    t CI; the verdict 'differs' when the CI excludes 0, else 'no difference shown'."""
    bad = sum(not (_usable(x) and _usable(y)) for x, y in zip(a, b, strict=True))
    if bad:
        return {"n": len(a), "not_finite": bad, "slope": None, "ci": None, "verdict": "not finite"}
    d, ci = mean_ci([log_slope(x) - log_slope(y) for x, y in zip(a, b, strict=True)])
    verdict = (
        "no CI" if ci is None else "differs" if ci[0] > 0 or ci[1] < 0 else "no difference shown"
    )
    return {"n": len(a), "not_finite": 0, "slope": d, "ci": ci, "verdict": verdict}


def ablation(results: dict, depth: int, seeds: list[int]) -> dict:
    """differences[placement, norm, ffn]: the paired W2 slope difference, FFN - relu, under the
    xiong init."""
    out = {}
    for placement, norm in ABLATION_ARMS:
        relu = [results["xiong-relu", placement, norm, depth, s]["w2"] for s in seeds]
        for ffn in PAIRED_FFNS:
            other = [results[f"xiong-{ffn}", placement, norm, depth, s]["w2"] for s in seeds]
            out[placement, norm, ffn] = paired_slope_difference(other, relu)
    return out


def slope_text(t: dict) -> str:
    """'rises, +0.031 per layer (95% CI +0.012..+0.050, n = 10)' from trend()."""
    if t["slope"] is None:
        return f"not finite in {t['not_finite']} of {t['n']} seeds (no slope)"
    ci = f"95% CI {t['ci'][0]:+.3g}..{t['ci'][1]:+.3g}, " if t["ci"] else ""
    return f"{t['verdict']}, {t['slope']:+.3g} per layer ({ci}n = {t['n']})"


def gain_text(g: dict) -> str:
    """'shrinks, x0.912 per block (95% CI 0.8893..0.9351, n = 10)' from gain_summary()."""
    if g["gain"] is None:
        return f"not finite in {g['not_finite']} of {g['n']} seeds"
    ci = f"95% CI {g['ci'][0]:.4g}..{g['ci'][1]:.4g}, " if g["ci"] else ""
    return f"{g['verdict']}, x{g['gain']:.4g} per block ({ci}n = {g['n']})"


def summarise(results: dict, depths: list[int], seeds: list[int]) -> tuple[dict, dict]:
    """trends[setting, placement, norm, depth, measure] and gains[setting, placement, norm] (deepest
    depth)."""
    trends, gains = {}, {}
    for setting in SETTINGS:
        for placement, norm in ARMS:
            for depth in depths:
                runs = [results[setting, placement, norm, depth, s] for s in seeds]
                for m in MEASURES:
                    trends[setting, placement, norm, depth, m] = trend([r[m] for r in runs])
                if all("gain" in r for r in runs):
                    gains[setting, placement, norm] = gain_summary([r["gain"] for r in runs])
    return trends, gains


def findings(trends: dict, gains: dict, diffs: dict, depth: int) -> list[str]:
    """Per setting at the deepest depth: one sentence per measure with every arm's slope verdict,
    and one with every arm's Jacobian gain, each with its estimate, 95% CI and n (Xiong et al. 2020,
    Fig. 3: the W2 gradient of Post-LN rises with layer index, Pre-LN's is flat); then per Post-LN /
    Pre-LN arm the FFN ablation: the W2 slope under each feed-forward and the paired differences
    from ReLU."""
    out = []
    for setting in SETTINGS:
        for m, label in MEASURES.items():
            parts = [f"{p} {n} {slope_text(trends[setting, p, n, depth, m])}" for p, n in ARMS]
            out.append(
                f"`{setting}`, {depth} layers, {label}, slope of log(grad norm) vs layer (mean of "
                "per-seed "
                f"OLS slopes, verdict by its 95% t CI): " + "; ".join(parts) + "."
            )
        if gains:
            parts = [f"{p} {n} {gain_text(gains[setting, p, n])}" for p, n in ARMS]
            out.append(
                f"`{setting}`, {depth} layers, Jacobian gain of a block, the backward signal's "
                "(geometric "
                f"mean over blocks 2..{depth}, verdict by its 95% t CI over seeds): "
                + "; ".join(parts)
                + "."
            )
    for placement, norm in ABLATION_ARMS:
        each = [
            f"{ffn} {slope_text(trends[f'xiong-{ffn}', placement, norm, depth, 'w2'])}"
            for ffn in FFNS
        ]
        paired = [f"{ffn} - relu {slope_text(diffs[placement, norm, ffn])}" for ffn in PAIRED_FFNS]
        out.append(
            f"FFN ablation, `xiong` init, {depth} layers, {placement} {norm}, W2 slope per layer: "
            + "; ".join(each)
            + "; paired by seed (relu, gelu and relu2 share their weights), verdict by the "
            "95% t CI of the difference: " + "; ".join(paired) + "."
        )
    return out


def _ci_cell(t: dict, key: str, spec: str) -> str:
    if t[key] is None:
        return f"not finite ({t['not_finite']}/{t['n']})"
    ci = f" ({format(t['ci'][0], spec)}..{format(t['ci'][1], spec)})" if t["ci"] else ""
    return f"{format(t[key], spec)}{ci} {t['verdict']}"


def _geomean(xs: list[float]) -> float:
    return (
        math.exp(statistics.fmean(math.log(x) for x in xs))
        if all(x > 0 and math.isfinite(x) for x in xs)
        else float("nan")
    )


def table(
    results: dict, trends: dict, gains: dict, depths: list[int], seeds: list[int]
) -> list[str]:
    rows = [
        "| setting | placement | norm | depth | W2 slope per layer (95% CI) | all-matrix slope per "
        "layer (95% CI) "
        "| W2 last / first (geo. mean) | all last / first (geo. mean) | Jacobian gain per block "
        "2..L (95% CI) "
        "| Jacobian gain, block 1 (geo. mean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting in SETTINGS:
        for placement, norm in ARMS:
            for depth in depths:
                runs = [results[setting, placement, norm, depth, s] for s in seeds]
                ratio = {m: _geomean([r[m][-1] / r[m][0] for r in runs]) for m in MEASURES}
                deepest = depth == max(depths) and bool(gains)
                gain = _ci_cell(gains[setting, placement, norm], "gain", ".4g") if deepest else "-"
                first = f"{_geomean([r['gain'][0] for r in runs]):.3g}" if deepest else "-"
                rows.append(
                    f"| {setting} | {placement} | {norm} | {depth} "
                    f"| {_ci_cell(trends[setting, placement, norm, depth, 'w2'], 'slope', '+.3g')} "
                    "| "
                    f"{_ci_cell(trends[setting, placement, norm, depth, 'all'], 'slope', '+.3g')} "
                    f"| {ratio['w2']:.3g} | {ratio['all']:.3g} | {gain} | {first} |"
                )
    return rows


def _finite(x):
    return x if x is None or math.isfinite(x) else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--depths", type=number(int, ">= 1"), nargs="+", default=[2, 8, 24])
    p.add_argument("--seeds", type=number(int, ">= 0"), nargs="+", default=list(range(10)))
    p.add_argument("--dim", type=number(int, ">= 2"), default=64)
    p.add_argument("--batch", type=number(int, ">= 1"), default=8)
    p.add_argument("--seq", type=number(int, ">= 2"), default=64)
    p.add_argument(
        "--jvp-dirs",
        type=number(int, ">= 0"),
        default=4,
        help="random directions per block for the Jacobian gain "
        "(measured at the deepest depth; 0: not measured)",
    )
    p.add_argument(
        "--threads",
        type=number(int, ">= 1"),
        default=1,
        help="torch threads (models this small run fastest on one)",
    )
    p.add_argument("--out", type=Path, default=Path("lab/results/init-grads"))
    a = p.parse_args(argv)
    if a.dim % 4 or min(a.depths) < 2 or a.jvp_dirs < 0:
        print(
            "error: --dim must be a multiple of 4 (4 heads), --depths >= 2 (a slope needs two "
            "layers), "
            "--jvp-dirs >= 0",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(a.threads)
    start, cpu = time.perf_counter(), time.process_time()
    results = {}
    for setting, extra in SETTINGS.items():
        for placement, norm in ARMS:
            for depth in a.depths:
                args = ModelArgs(
                    dim=a.dim,
                    n_layers=depth,
                    n_heads=4,
                    n_kv_heads=2,
                    vocab_size=256,
                    max_seq_len=a.seq,
                    norm=norm,
                    placement=placement,
                    norm_impl="reference",
                    ops_impl="reference",
                    **extra(a.dim),
                )  # forward-mode JVP needs torch ops
                dirs = a.jvp_dirs if depth == max(a.depths) else 0
                for seed in a.seeds:
                    results[setting, placement, norm, depth, seed] = measure(
                        args, a.batch, a.seq, seed, dirs
                    )
    wall_min = round((time.perf_counter() - start) / 60, 1)
    # the wall time depends on who else uses the cores
    cpu_min = round((time.process_time() - cpu) / 60, 1)
    trends, gains = summarise(results, a.depths, a.seeds)
    diffs = ablation(results, max(a.depths), a.seeds)
    rows = table(results, trends, gains, a.depths, a.seeds)
    print("\n".join(rows))
    a.out.mkdir(parents=True, exist_ok=True)
    figures = [
        ("init_grads.png", "all", "all-matrix grad norm"),
        ("init_grads_w2.png", "w2", "W2 grad norm"),
        ("jacobian_gain.png", "gain", "Jacobian gain"),
    ]
    for fname, key, label in figures:
        figure(results, a.depths, a.seeds, key, label, a.out / fname)
    said = findings(trends, gains, diffs, max(a.depths))
    about = __doc__.split("\n\n")[0].replace("\n", " ")
    command = (
        f"python lab/analyses/init_grads.py --depths {' '.join(map(str, a.depths))} --seeds "
        f"{' '.join(map(str, a.seeds))} --dim {a.dim} --batch {a.batch} --seq {a.seq} --jvp-dirs "
        f"{a.jvp_dirs}"
    )
    write_text(
        a.out / "report.md",
        "\n".join(
            [
                "# Per-layer gradient norm and Jacobian gain at initialization",
                "",
                about,
                "",
                f"{len(results)} models ({len(SETTINGS)} settings x {len(ARMS)} arms x "
                f"{len(a.depths)} depths x "
                f"{len(a.seeds)} seeds), {wall_min} min wall, {cpu_min} min CPU on {a.threads} "
                f"thread(s): `{command}`",
                "",
                *[
                    line
                    for para in __doc__.split("\n\n")[2:]
                    for line in (para.replace("\n", " ").strip(), "")
                ],
                "## What the numbers show",
                "",
                *[f"- {s}" for s in said],
                "",
                *[f"![{label} per layer at init]({fname})" for fname, _, label in figures],
                "",
                *rows,
                "",
            ]
        ),
    )
    write_text(
        a.out / "report.json",
        json.dumps(
            {
                "name": "init-grads",
                "about": about,
                "runs": len(results),
                "wall_min": wall_min,
                "cpu_min": cpu_min,
                "command": command,
                "findings": said,
                "layer_slopes": [
                    {"setting": s, "placement": p, "norm": n, "depth": d, "measure": m, **t}
                    for (s, p, n, d, m), t in trends.items()
                ],
                "gains": [
                    {"setting": s, "placement": p, "norm": n, "depth": max(a.depths), **g}
                    for (s, p, n), g in gains.items()
                ],
                "ffn_ablation": [
                    {
                        "placement": p,
                        "norm": n,
                        "ffn": f,
                        "minus": "relu",
                        "measure": "w2",
                        "depth": max(a.depths),
                        **d,
                    }
                    for (p, n, f), d in diffs.items()
                ],
                "measurements": {
                    "/".join(map(str, k)): {m: [_finite(x) for x in v] for m, v in r.items()}
                    for k, r in results.items()
                },
            },
            indent=1,
        )
        + "\n",
    )
    print(f"report: {a.out / 'report.md'}")
    return 0


def figure(
    results: dict, depths: list[int], seeds: list[int], key: str, label: str, path: Path
) -> None:
    """One panel per setting and arm: every seed's per-layer `key` (thin) and their geometric mean
    (thick), per depth, each panel its own log scale (the no-norm arm reaches 1e15)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, axes = plt.subplots(
        len(SETTINGS), len(ARMS), figsize=(2.4 * len(ARMS), 2.2 * len(SETTINGS)), squeeze=False
    )
    colors = {d: plt.cm.viridis(i / max(1, len(depths) - 1)) for i, d in enumerate(depths)}
    for row, setting in enumerate(SETTINGS):
        for col, (placement, norm) in enumerate(ARMS):
            ax = axes[row][col]
            for depth in depths:
                curves = [results[setting, placement, norm, depth, s].get(key) for s in seeds]
                if None in curves:
                    continue
                for g in curves:
                    ax.plot(range(1, depth + 1), g, lw=0.5, alpha=0.35, color=colors[depth])
                ax.plot(
                    range(1, depth + 1),
                    [_geomean(list(layer)) for layer in zip(*curves, strict=True)],
                    lw=1.5,
                    color=colors[depth],
                    label=f"{depth} layers",
                )
            ax.set_yscale("log")
            lo, hi = ax.get_ylim()
            if hi > 100 * lo:  # minor ticks over many decades (up to 15): unreadable, and most
                ax.yaxis.set_minor_locator(NullLocator())  # of the drawing time of 95 panels
            # y fixed: an automatic title position measures the axis's ticks (~1/3 of drawing)
            ax.set_title(f"{setting}: {placement} {norm}", fontsize=7, y=1.0)
            ax.set_xlabel("layer", fontsize=7)
        axes[row][0].set_ylabel(label, fontsize=7)
    axes[0][-1].legend(fontsize=6)
    for ax in axes.flat:
        ax.tick_params(labelsize=6)
    # fixed margins for a fixed grid of panels: tight_layout measures every tick label of 55 log
    # axes (~5 s each)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.04, top=0.97, wspace=0.42, hspace=0.55)
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
