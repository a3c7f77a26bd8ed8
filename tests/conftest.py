"""Shared fixtures and helpers. Test helpers live here once (import them: `from conftest import
tiny_args`).

NORMLAB_TEST_THREADS=N runs every test with N torch threads in-process, N threads per tiny training
run (train.threads) and OMP_NUM_THREADS=N for the subprocesses that do not set their own; unset, N
is the cores divided among pytest-xdist's workers, or in one process torch's default in-process and
tiny.yaml's one thread for tiny runs. Each test starts at that count, whatever an earlier in-process
run set (train.threads changes the process-wide setting)."""

import json
import os
import random
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import torch
import zygote

os.environ.setdefault("WANDB_MODE", "disabled")  # tests never reach the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "configs" / "train" / "tiny.yaml")
# subprocesses (train.py, scripts, torchrun) import this checkout's packages, not whichever checkout
# an editable install points at (two checkouts side by side would otherwise test each other's code)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
)
# under pytest-xdist each worker gets its share of the cores: torch's default of one thread per core
# in every worker makes each OpenMP barrier wait for a thread another worker has descheduled (a
# 2-thread step ran 20x slower beside a busy process, issue 42)
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = int(os.environ.get("NORMLAB_TEST_THREADS", "0")) or (
    max(1, (os.cpu_count() or 1) // WORKERS) if WORKERS > 1 else 0
)
DEFAULT_THREADS = torch.get_num_threads()
if THREADS:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)

# `python train.py ...` and `python -m ...` started by a test are forked from a process that has
# imported torch once (tests/zygote.py: ~2.5 s of imports saved per launch); a test about a
# process's own start-up starts its processes as usual inside `with zygote.real():`
subprocess.Popen = zygote.Popen

WORDS = (
    "the a norm layer model train loss grad step rate mean scale root square token batch stable "
    "spike learn weight decay warm cosine head block residual stream value key query attention "
    "of to and in is for with on by as it at from that this be are was"
).split()


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS or DEFAULT_THREADS)


@pytest.fixture(autouse=True)
def _environment():
    """Each test starts with the session's environment, whatever an earlier one set or a library
    it ran in this process did (Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK, a submitit task its
    threads)."""
    with mock.patch.dict(os.environ):
        yield


def imported(importtime_log: str, module: str) -> bool:
    """Whether `python -X importtime`'s log (stderr) shows `module` imported, at any depth (a nested
    import is indented: `|   torch`)."""
    return any(line.split("|")[-1].strip() == module for line in importtime_log.splitlines())


def tiny_args(**kw):
    """A small ModelArgs (2 layers, d = 32, grouped-query attention) for model-level tests; kw
    override it."""
    from model import ModelArgs

    return ModelArgs(
        **{**dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16), **kw}
    )


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (b is the reference)."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def write_corpus(path, paragraphs: int = 300, seed: int = 0) -> str:
    """A deterministic pseudo-English corpus: blank-line separated paragraphs of random words."""
    rng = random.Random(seed)
    paras = []
    for _ in range(paragraphs):
        lines = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "."
            for _ in range(rng.randint(1, 4))
        ]
        paras.append("\n".join(lines))
    text = "\n\n".join(paras) + "\n"
    path.write_text(text)
    return text


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    write_corpus(path)
    return path


@pytest.fixture(scope="session")
def prepared(corpus_file, tmp_path_factory):
    """A small prepared dataset (vocab 320) shared by the data, training and study tests."""
    from data.prepare import prepare

    return prepare(
        f"text:{corpus_file}",
        vocab_size=320,
        val_fraction=0.1,
        root=tmp_path_factory.mktemp("prepared"),
        verbose=False,
    )


@pytest.fixture(scope="session")
def pydocs_1024(tmp_path_factory):
    """The embedded corpus (pydocs) prepared at vocab 1024, as the DyT and default studies use it
    (~5 s, once)."""
    from data.prepare import prepare

    return prepare("pydocs", vocab_size=1024, root=tmp_path_factory.mktemp("pydocs"), verbose=False)


@pytest.fixture
def data_args(prepared):
    """Overrides that point a run at the session's small prepared corpus (a cache hit)."""
    meta = json.loads((prepared / "meta.json").read_text())
    threads = [f"train.threads={THREADS}"] if THREADS else []
    return [
        f"data.source={meta['source']}",
        f"data.root={prepared.parent}",
        "data.vocab_size=320",
        "data.val_fraction=0.1",
        *threads,
    ]


@pytest.fixture
def run_tiny(tmp_path, data_args):
    """run_tiny(*args) -> exit code: train.py in-process on configs/train/tiny.yaml and the
    session's corpus, writing under tmp_path (so a run named N is tmp_path / N)."""
    import train

    def run(*args: str) -> int:
        return train.main(["--config", TINY, f"log.out_dir={tmp_path}", *data_args, *args])

    return run


def logged(run_dir, key: str = "train/loss") -> list:
    """Every logged value of one metric of a run, in step order."""
    from training.rundir import read_metrics

    return [r[key] for r in read_metrics(Path(run_dir) / "metrics.jsonl") if key in r]


def write_run(
    root: Path,
    name: str,
    norm: str,
    lr: float,
    seed: int,
    status: str,
    final,
    l0: float = 5.0,
    step0: bool = True,
    placement: str = "pre",
    overrides: tuple = (),
):
    """A finished run directory made by hand (config, summary, a 3-step metrics file), no training:
    for the study and report tests. final=None for a run without a final loss; `overrides` set more
    config fields."""
    import json

    from training.config import load_config, to_yaml

    cfg = load_config(
        Path(TINY),
        [
            f"model.norm={norm}",
            f"optim.lr={lr}",
            f"train.seed={seed}",
            f"model.placement={placement}",
            *overrides,
        ],
    )
    d = root / "runs" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(to_yaml(cfg))
    records = [{"step": 0, "val/loss": l0, "val/loss_se": 0.01}] if step0 else []
    records += [
        {
            "step": s,
            "train/loss": l0 - s * 0.1,
            "grad/norm": 1.0 + s,
            "grad/norm/layer_0": 0.5,
            "grad/norm/layer_1": 0.25,
            "act/rms/layer_0": 1.0 + s,
            "act/rms/layer_1": 2.0 + s,
            "attn/logit_max/layer_0": lr * 100,
            "attn/logit_max/layer_1": lr * 10,
        }
        for s in (1, 2, 3)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": status,
                "final_val_loss": final,
                "best_val_loss": final,
                "unigram_entropy": 4.0,
                "spike_score/loss": 1.0,
                "spike_score/grad_norm": 3.0,
                "tokens_per_s": 1000.0 * (1 + seed),
                "spike_window": 5,
                "spike_k": 5.0,
                "diverged_at": 2 if status == "diverged" else None,
            }
        )
    )


def eval_bits_per_nat(cfg) -> float:
    """An independent count of a config's bits per nat: its eval set's target tokens / the UTF-8
    bytes they encode / ln 2 (the evals' fixed val tokens: train.eval_tokens of them, seq_len a
    row)."""
    import math

    import numpy as np

    from data.loader import load_tokens
    from data.prepare import prepare
    from data.tokenizer import Tokenizer

    prepared = prepare(**vars(cfg.data), verbose=False)
    tokens = load_tokens(prepared, "val")
    seq, budget = cfg.train.seq_len, cfg.train.eval_tokens
    rows = (len(tokens) - 1) // seq
    n = rows if budget <= 0 else min(max(1, budget // seq), rows)
    targets = np.asarray(tokens[1 : n * seq + 1], dtype=np.int64)
    n_bytes = int(Tokenizer(prepared / "tokenizer.model").token_bytes()[targets].sum())
    return len(targets) / n_bytes / math.log(2)
