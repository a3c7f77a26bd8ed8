"""Generate text from a run's checkpoint.

python -m scripts.sample runs/default-rmsnorm-pre --prompt "The list" --tokens 100
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from data.tokenizer import Tokenizer
from training import errors
from training.checkpoint import load_run
from training.config import load_config, number
from training.cpu import tune_cpu


def main(argv: list[str] | None = None) -> int:
    """The command: its errors end in one line and their code (training/errors.py)."""
    return errors.run(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = errors.Parser(prog="python -m scripts.sample", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--prompt", default="The ")
    p.add_argument("--tokens", type=number(int, ">= 1"), default=100)
    p.add_argument("--temperature", type=number(float, ">= 0"), default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=number(int, ">= 0"), default=50, help="0 = every token")
    p.add_argument("--num", type=number(int, ">= 1"), default=1, help="number of samples")
    p.add_argument("--seed", type=number(int, ">= 0"), default=0)
    a = p.parse_args(argv)
    model, prepared = load_run(a.run_dir)
    tok = Tokenizer(prepared / "tokenizer.model")
    threads = load_config(a.run_dir / "config.yaml").train.threads
    tune_cpu(threads, malloc=False)  # train.py's choice: its cores less the machine's load
    gen = torch.Generator().manual_seed(a.seed)
    prompt = torch.tensor([tok.encode(a.prompt)] * a.num)
    out = model.generate(prompt, a.tokens, temperature=a.temperature, top_k=a.top_k, generator=gen)
    for row in out:
        print(tok.decode(row.tolist()))
        print("-" * 40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
