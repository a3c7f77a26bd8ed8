"""Every command in the README's and docs' code blocks: the fast ones run verbatim on the embedded
corpus, in a fresh copy of the repository, so a documented command cannot rot; the slow ones are
listed here by name, with why. Shown output (a ```text block of `$ command` and the lines it prints)
is checked against what the command prints, with numbers free to differ."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model.blocks import BLOCKS
from model.norm_config import NORMS

REPO = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "docs/usage.md", "docs/performance.md"]

MULTINODE = (
    "torchrun --nnodes 2 --node_rank $NODE_RANK --nproc_per_node 1 --master_addr $MASTER_ADDR "
    "--master_port 29500 train.py train.parallel=fsdp"
)
# Not run here (each is minutes long, or is this test suite itself); everything else in a code block
# is.
BENCH = (
    "a benchmark (minutes) that rewrites the committed result; tests/test_bench.py runs it small"
)
TWO = "the default model in two processes (minutes); "
SLOW = {
    "python -m pip install -r requirements.txt && python train.py": (
        "installs, trains the default model (~2 min)"
    ),
    "python -m pip install -r requirements-dev.txt && ruff check . && ruff format --check . "
    "&& python -m pytest -q": "this test suite (.ci/run runs exactly it)",
    'python -m pytest -q -m "not slow"': "this test suite's fast tier",
    "python train.py --norm layernorm": "the default model, 300 steps (~2 min)",
    "python train.py --placement post optim.lr=1e-2": "the default model, 300 steps (~2 min)",
    "python -m normlab.inspect runs/default-rmsnorm-pre runs/default-layernorm-pre": (
        "needs the two default runs above; tests/test_inspect.py runs it on constructed runs"
    ),
    "python train.py --name my-run train.stop_at=100": "the default model, 100 steps (~45 s)",
    "python -m scripts.convert_norms runs/default-layernorm-pre runs/ln-as-rmsnorm": (
        "needs the default LayerNorm run above; tests/test_convert.py converts a trained tiny run"
    ),
    "python -m scripts.convert_norms runs/tiny-layernorm-pre runs/tiny-as-rmsnorm": (
        "needs a tiny LayerNorm run; tests/test_convert.py converts a trained tiny run"
    ),
    "python -m scripts.convert_norms --hf path/to/gpt2 gpt2-rmsnorm.pt": (
        "needs a GPT-2 directory; tests/test_convert.py converts a local tiny GPT-2"
    ),
    "python train.py --name my-run --resume": "the default model, 200 more steps (~90 s)",
    "torchrun --standalone --nproc_per_node 2 train.py": (
        TWO + "tests/test_train.py runs it on the tiny config"
    ),
    "torchrun --standalone --nproc_per_node 2 train.py train.parallel=fsdp": (
        TWO + "tests/test_sharded.py runs it on the tiny config"
    ),
    "torchrun --standalone --nproc_per_node 2 train.py train.parallel=tp": (
        TWO + "tests/test_sharded.py runs it on the tiny config"
    ),
    MULTINODE: (
        "two machines; tests/test_sharded.py runs it as two nodes on loopback with the tiny config"
    ),
    "python -m lab.sweep lab/studies/norm-placement-lr.yaml --executor slurm --partition gpu "
    "--time 60": "needs a SLURM cluster; tests/lab/test_submit.py checks its submission",
    "python -m lab.sweep lab/studies/norm-placement-lr.yaml --slurm study.sbatch": (
        "writes a file into the checkout; tests/lab/test_study.py runs such an array's tasks "
        "locally"
    ),
    "python -m bench.gpu_check": "needs a GPU; tests/test_gpu_path.py runs its --dry-run",
    "python -m lab.sweep lab/studies/norm-placement-lr.yaml": (
        "the default study: a 180-run grid at 3 budgets and the protocol's stages (hours)"
    ),
    "python -m lab.compare studies/norm-placement-lr": "needs the default study above",
    "python -m bench.bench_norms --save bench/results/norms.md": BENCH,
    "python -m bench.bench_study --save bench/results/study.md": BENCH,
    "python -m bench.bench_study --runs 6 --rounds 1 --workers 2": (
        "a benchmark: 12 runs of the default model, 300 steps each (~2-3 min); "
        "tests/test_bench.py runs it small"
    ),
    "python -m bench.bench_train --rounds 20 --save bench/results/train.md": BENCH,
    "python -m bench.bench_step --rounds 40 --steps 3 --breakdown 'before (all put back)' "
    "current --save bench/results/step.md": BENCH,
    "python -m bench.bench_train --rounds 10 --only '(fused)' --no-breakdown model.dim=768 "
    "model.n_heads=12 model.n_kv_heads=4 train.seq_len=512 train.batch_size=4 "
    "--save bench/results/train-d768.md": BENCH,
}


def code_blocks(kind: str, pages=PAGES) -> list[str]:
    return [
        b
        for page in pages
        for b in re.findall(rf"```{kind}\n(.*?)```", (REPO / page).read_text(), flags=re.S)
    ]


def readme_commands(pages=PAGES) -> list[str]:
    """The commands of the pages' ```bash blocks, in order, without their trailing comments."""
    lines = [
        re.sub(r"\s+#\s.*$", "", line).strip()
        for block in code_blocks("bash", pages)
        for line in block.splitlines()
    ]
    return [line for line in lines if line and not line.startswith("#")]


def shown_outputs() -> dict[str, list[str]]:
    """{command: the lines shown under it} from the pages' ```text blocks that start with `$
    command`."""
    shown = {}
    for block in code_blocks("text"):
        lines = block.rstrip("\n").splitlines()
        if lines and lines[0].startswith("$ "):
            shown[lines[0][2:]] = lines[1:]
    return shown


def shape(line: str) -> str:
    """A shown line as a pattern: numbers (with separators and exponents) may differ, everything
    else may not."""
    parts = re.split(r"\d[\d,.]*(?:e[-+]?\d+)?", line)
    return r"\d[\d,.]*(?:e[-+]?\d+)?".join(re.escape(p) for p in parts)


def test_every_documented_command_is_run_or_listed_as_slow():
    commands = readme_commands()
    assert len(commands) >= 10 and "python train.py --config configs/train/tiny.yaml" in commands
    assert set(SLOW) <= set(commands), (
        f"SLOW lists commands the docs no longer have: {set(SLOW) - set(commands)}"
    )
    assert set(shown_outputs()) <= set(commands) | {"python train.py --norm groupnorm"}


def test_the_readme_names_every_norm_and_placement_and_quotes_the_code():
    text = (REPO / "README.md").read_text()
    norms = re.search(r"Norms: (.*?)\. Placements: (.*?)\. ", text, re.S)
    assert re.findall(r"`(\w+)`", norms.group(1)) == list(NORMS)
    assert re.findall(r"`(\w+)`", norms.group(2)) == list(BLOCKS)
    for snippet in code_blocks("python", ["README.md"]):
        if "Monitor" in snippet:  # the loop: run by test_the_readmes_own_loop_runs
            continue
        code = (REPO / "model" / "norms.py").read_text()
        assert all(line in code for line in snippet.splitlines()), snippet


def test_the_readmes_own_loop_runs(tmp_path, monkeypatch):
    """The README's "Your own training loop" verbatim, on a transformers GPT-2 built from a config:
    its folder gets the records of every step and the probe's metrics on step 1."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    (snippet,) = [b for b in code_blocks("python", ["README.md"]) if "Monitor" in b]
    assert len([line for line in snippet.splitlines() if line.strip()]) <= 10  # lines of code
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2))
    tokens = torch.randint(0, 64, (6, 2, 16), generator=torch.Generator().manual_seed(0))
    loader = [(x, x) for x in tokens]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monkeypatch.chdir(tmp_path)
    exec(snippet, {"model": model, "loader": loader, "opt": opt, "torch": torch})
    records = [json.loads(line) for line in open("runs/my-loop/metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert "grad/norm/layer_1" in records[0] and "train/loss" in records[5]
    assert (tmp_path / "runs" / "my-loop" / "summary.json").is_file()


def test_shape_lets_numbers_differ_and_nothing_else():
    pattern = shape("step 10: train loss 5.0456, val loss 4.9598 (72,699 tokens/s, lr 3.00e-04)")
    assert re.fullmatch(pattern, "step 20: train loss 4.1, val loss 12 (1,002 tokens/s, lr 1e-3)")
    assert not re.fullmatch(pattern, "step 20: train loss 4.1, val loss 12 (1,002 tok/s, lr 1e-3)")


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> Path:
    """The repository's tracked files, as a new user's checkout has them (no runs, no prepared
    data)."""
    files = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    root = tmp_path_factory.mktemp("clone")
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    return root


@pytest.mark.slow
def test_fast_readme_commands_run_verbatim_on_the_embedded_corpus(fresh_clone):
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # as a user runs them
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # this python
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    ran, shown = [], shown_outputs()
    # each once, in the order a reader meets them
    for command in dict.fromkeys([*readme_commands(), *shown]):
        if command in SLOW:
            continue
        r = subprocess.run(
            ["bash", "-c", command],
            cwd=fresh_clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        want = 2 if "groupnorm" in command else 0  # docs/usage.md shows what a bad flag prints
        assert r.returncode == want, f"{command!r} ({r.returncode}):\n{r.stderr[-3000:]}"
        printed = re.split(r"[\r\n]", r.stdout + r.stderr)  # tqdm redraws its bar with \r
        for line in shown.get(command, []):
            assert any(re.search(shape(line), p) for p in printed), (
                f"{command!r} no longer prints {line!r}"
            )
        ran.append(command)
    smoke = {
        "python train.py --config configs/train/tiny.yaml",
        "python -m lab.sweep lab/studies/quick.yaml",
    }
    assert smoke <= set(ran)
    # the smoke study shows a newcomer at least one run that learns
    runs = json.loads((fresh_clone / "studies" / "quick" / "sweep.json").read_text())["runs"]
    assert len(runs) == 8 and "ok" in {r["status"] for r in runs}
    assert (fresh_clone / "studies" / "quick" / "report.md").is_file()
    assert (fresh_clone / "exports" / "tiny" / "model.safetensors").is_file()
