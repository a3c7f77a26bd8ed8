"""Convert a pre-LayerNorm model to pre-RMSNorm with the same logits (Jiang et al. 2023).

    python -m scripts.convert_norms runs/ln-pre runs/ln-pre-rmsnorm
    python -m scripts.convert_norms --hf path/to/gpt2 gpt2-rmsnorm.pt

A normlab run (placement pre or lns, model.norm layernorm without bias) becomes a run directory of
the converted model: config.yaml (model.norm rmsnorm, an untied head) and checkpoints/latest.pt with
its weights, for sample.py, export_hf.py (a pre-RMSNorm model is a LlamaForCausalLM) and evaluation;
it has no optimizer state to resume training from. A local Hugging Face GPT-2 directory becomes a
whole pickled module (its LayerNorms replaced by torch's RMSNorm): reload it with torch.load(path,
weights_only=False). The command reports the largest logit difference between the model and its
conversion in float64 and float32 and, for a run, the validation loss of the model, of its
conversion and of the naive swap (each LayerNorm replaced by an RMSNorm with the same gain), which
computes something else. Post-norm and other layouts are refused with the reason."""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
from pathlib import Path

import torch

from training import errors
from training.checkpoint import save_durably
from training.config import ConfigError
from training.rundir import RunDir, replacing, write_text

WINDOWS = 8  # validation windows (seq_len tokens each) the logits are compared on


@torch.no_grad()
def logits_of(model, idx: torch.Tensor) -> torch.Tensor:
    """`model`'s logits (float64) on token ids idx, in eval mode."""
    out = model.eval()(idx)
    return (out[0] if isinstance(out, tuple) else out.logits).double()


def loss_of(model, windows: torch.Tensor) -> float:
    """Mean next-token cross-entropy (nats) over token windows (n, T + 1)."""
    logits = logits_of(model, windows[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()


def differences(model, convert, idx: torch.Tensor) -> str:
    """The report's line: the largest |logit difference| between the model and its conversion, both
    in float64, then both in float32 (and each float32 model against the float64 original's logits:
    LayerNorm's centring of a stream with a mean loses float32 digits that RMSNorm's does not)."""
    truth = logits_of(copy.deepcopy(model).double(), idx)
    scale = truth.abs().max().item()
    a64 = copy.deepcopy(model).double()
    f64 = (logits_of(convert(a64), idx) - truth).abs().max().item()
    a32 = copy.deepcopy(model).float()
    la, lb = logits_of(a32, idx), logits_of(convert(copy.deepcopy(a32)), idx)
    f32, own, conv = ((x - y).abs().max().item() for x, y in ((la, lb), (la, truth), (lb, truth)))
    return (
        f"max |logit difference| over {idx.numel():,} tokens: float64 {f64:.1e}; float32 "
        f"{f32 / scale:.1e} of the largest |logit| {scale:.3g} (against the float64 logits: the "
        f"model {own / scale:.1e}, its conversion {conv / scale:.1e})"
    )


def convert_run(run_dir: Path, out_dir: Path) -> list[str]:
    """Write the converted run to out_dir (built beside it, renamed into place); the report."""
    from data.loader import eval_batches, load_tokens
    from model.convert import refusal, swap_norms, to_rmsnorm
    from training.checkpoint import candidates, load_run, save_checkpoint
    from training.config import load_config, to_yaml

    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"{out_dir} already exists and is not empty; choose another directory")
    cfg = load_config(run_dir / "config.yaml")
    reason = refusal(cfg.model)  # before loading anything
    if reason:
        raise ConfigError(f"{run_dir}: no exact LayerNorm -> RMSNorm conversion: {reason}")
    model, prepared = load_run(run_dir)
    step = candidates(RunDir(run_dir).checkpoint)[0][0].step
    exact = to_rmsnorm(model)
    naive = copy.deepcopy(model)
    count = swap_norms(naive, "rmsnorm")
    batches = eval_batches(
        load_tokens(prepared, "val"), cfg.train.seq_len, WINDOWS, cfg.train.eval_tokens
    )
    x, y, _ = next(batches)
    windows = torch.cat([x, y[:, -1:]], 1)
    before, after, swapped = (loss_of(m, windows) for m in (model, exact, naive))
    report = [
        f"{run_dir}: {count} LayerNorms -> RMSNorm (gains folded into the layers they feed, the "
        "embedding and each block's wo and w2 re-centred, the head untied)",
        differences(model, to_rmsnorm, x),
        f"val loss on those {len(x)} windows: LayerNorm {before:.4f}, converted {after:.4f} "
        f"({after - before:+.1e}), naive swap {swapped:.4f} ({swapped - before:+.4f} nats)",
    ]
    cfg.model = exact.args
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "checkpoints").mkdir(parents=True)
        write_text(tmp / "config.yaml", to_yaml(cfg))
        state = {k: v.contiguous() for k, v in exact.state_dict().items()}
        save_checkpoint(tmp / "checkpoints" / "latest.pt", {"model": state, "step": step})
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report + [f"wrote {out_dir} (python -m scripts.sample {out_dir})"]


def convert_hf(model_dir: Path, out: Path) -> list[str]:
    """Write the converted GPT-2 to `out` (torch.save of the whole module, atomic); the report."""
    from transformers import AutoModelForCausalLM

    from normlab.convert import gpt2_to_rmsnorm

    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # no library noise before the one line of a refusal
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    except OSError as e:  # transformers' own "no file named ..." (no errno): a model folder's fault
        if errors.storage_fault(e) is not None:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"{model_dir} cannot be loaded as a Hugging Face model: {first}"
        ) from None
    exact = gpt2_to_rmsnorm(copy.deepcopy(model))
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, model.config.vocab_size, (WINDOWS, 32), generator=gen)
    report = [
        f"{model_dir}: {2 * model.config.n_layer + 1} LayerNorms -> torch.nn.RMSNorm (gains and "
        "biases folded, wte, wpe and each block's c_proj re-centred, lm_head untied with a bias)",
        differences(model, gpt2_to_rmsnorm, idx) + " (random token ids)",
    ]
    with replacing(out) as path:
        save_durably(exact, path)  # a full disk's RuntimeError from torch.save as an OSError
    return report + [f"wrote {out} (reload: torch.load({str(out)!r}, weights_only=False))"]


def main(argv: list[str] | None = None) -> int:
    """The command: its errors end in one line and their code (training/errors.py)."""
    return errors.run(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = errors.Parser(
        prog="python -m scripts.convert_norms",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", type=Path, help="a run directory (or, with --hf, a model directory)")
    p.add_argument("out", type=Path, help="the run directory (with --hf: the .pt file) to write")
    p.add_argument("--hf", action="store_true", help="source is a Hugging Face GPT-2 directory")
    a = p.parse_args(argv)
    if a.out.exists() and (a.hf and a.out.is_dir() or not a.hf and not a.out.is_dir()):
        want = "a .pt file" if a.hf else "a run directory"
        raise errors.BadInput(f"{a.out} is in the way: the output is {want}; choose another path")
    try:
        lines = convert_hf(a.source, a.out) if a.hf else convert_run(a.source, a.out)
    except ImportError as e:
        raise errors.BadInput(f"--hf needs transformers ({e}); pip install -r "
                              "requirements-dev.txt") from None  # fmt: skip
    except Exception as e:  # a full disk: the output appears whole or not at all
        code = errors.classify(e, a.out)
        if code is None or code[0] != errors.EXIT_STORAGE:
            raise
        print(code[1], file=sys.stderr)
        return code[0]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
