"""Export a run as a transformers model directory: LlamaForCausalLM weights (safetensors) and the
run's SentencePiece tokenizer as a Llama tokenizer, loadable with AutoModelForCausalLM /
AutoTokenizer.

    python -m scripts.export_hf runs/default-rmsnorm-pre exports/default

Only what LlamaForCausalLM can express exports (pre-norm RMSNorm, no qk-norm, no norm bias);
anything else is refused with the reason. The directory appears only once it is complete."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from model.hf import check_expressible
from training import errors
from training.checkpoint import load_run
from training.config import ConfigError, load_config
from training.rundir import RunDir


def export(run_dir: Path, out_dir: Path) -> Path:
    """Write the run's model and tokenizer to out_dir (built beside it, then renamed into place)."""
    from transformers import LlamaTokenizer
    from transformers.utils import logging as hf_logging

    from model.hf import to_hf

    hf_logging.set_verbosity_error()  # its progress bars and notes would come before a refusal
    hf_logging.disable_progress_bar()

    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is a file; the export is a folder: choose another path")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(
            f"{out_dir} already exists and is not empty; choose another output directory"
        )
    if RunDir(run_dir).config.is_file():  # refuse before loading anything
        check_expressible(load_config(RunDir(run_dir).config).model)
    model, prepared = load_run(run_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        to_hf(model).save_pretrained(tmp, safe_serialization=True)
        # transformers converts the SentencePiece model to its tokenizers BPE (tokenizer.json); our
        # tokenizer adds no BOS / EOS and no dummy prefix space, so the export must not either
        shutil.copy(prepared / "tokenizer.model", tmp / "tokenizer.model")
        tok = LlamaTokenizer.from_pretrained(
            tmp, add_bos_token=False, add_eos_token=False, add_prefix_space=False
        )
        tok.save_pretrained(tmp)
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """The command: its errors end in one line and their code (training/errors.py)."""
    return errors.run(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = errors.Parser(prog="python -m scripts.export_hf", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "run_dir",
        type=Path,
        help="a run directory (config.yaml and a checkpoint: latest.pt, or a "
        "sharded run's latest.dcp; the newer of them)",
    )
    p.add_argument("out_dir", type=Path, help="the transformers model directory to write")
    a = p.parse_args(argv)
    try:
        out = export(a.run_dir, a.out_dir)
    except ImportError as e:
        raise errors.BadInput(f"exporting needs transformers ({e}); pip install -r "
                              "requirements-dev.txt") from None  # fmt: skip
    except Exception as e:  # a full disk (safetensors wraps its OSError): named by its path
        code = errors.classify(e, a.out_dir)
        if code is None or code[0] != errors.EXIT_STORAGE:
            raise
        print(code[1], file=sys.stderr)
        return code[0]
    print(f"exported {a.run_dir} -> {out} (AutoModelForCausalLM / AutoTokenizer.from_pretrained)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
