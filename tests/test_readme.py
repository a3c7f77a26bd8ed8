"""Every command in the README's code blocks: the fast ones run verbatim on the embedded corpus, in a fresh copy
of the repository, so a README command cannot rot; the slow ones are listed here by name, with why."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

MULTINODE = ("torchrun --nnodes 2 --node_rank $NODE_RANK --nproc_per_node 1 --master_addr $MASTER_ADDR "
             "--master_port 29500 train.py train.parallel=fsdp")
# Not run here (each is minutes long, or is this test suite itself); everything else in a code block is.
SLOW = {
    "python -m pip install -r requirements.txt && python train.py": "installs, trains the default model (~3.5 min)",
    "python -m pip install -r requirements-dev.txt && python -m pytest -q": "this test suite",
    "python train.py --norm layernorm": "the default model, 300 steps (~3 min)",
    "python train.py --placement post optim.lr=1e-2": "the default model, 300 steps (~3 min)",
    "python train.py --name my-run train.stop_at=100": "the default model, 100 steps (~1 min)",
    "python train.py --name my-run --resume": "the default model, 200 more steps (~2 min)",
    "torchrun --nproc_per_node 2 train.py": "the default model in two processes (~4 min)",
    "torchrun --nproc_per_node 2 train.py train.parallel=fsdp": "the default model in two processes (~4 min); "
    "tests/test_sharded.py runs it on the tiny config",
    "torchrun --nproc_per_node 2 train.py train.parallel=tp": "the default model in two processes (~4 min); "
    "tests/test_sharded.py runs it on the tiny config",
    MULTINODE: "two machines; tests/test_sharded.py runs it as two nodes on loopback with the tiny config",
    "python scripts/sweep.py configs/study.yaml --slurm study.sbatch": "writes a file into the checkout; "
    "tests/test_study.py runs such an array's tasks locally",
    "python scripts/gpu_check.py": "needs a GPU; tests/test_gpu_path.py runs its --dry-run",
    "python scripts/sweep.py configs/study.yaml": "68 runs in two stages (~12 min)",
    "python scripts/compare.py studies/norm-placement-lr": "needs the 40-run study above",
}


def readme_commands() -> list[str]:
    """The commands of the README's ```bash blocks, in order, without their trailing comments."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_every_readme_command_is_run_or_listed_as_slow():
    commands = readme_commands()
    assert len(commands) >= 10 and "python train.py --config configs/tiny.yaml" in commands
    assert set(SLOW) <= set(commands), f"SLOW lists commands the README no longer has: {set(SLOW) - set(commands)}"


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> Path:
    """The repository's tracked files, as a new user's checkout has them (no runs, no prepared data)."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    root = tmp_path_factory.mktemp("clone")
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    return root


@pytest.mark.slow
def test_fast_readme_commands_run_verbatim_on_the_embedded_corpus(fresh_clone):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # this python
           "PYTHONPATH": str(fresh_clone),  # its own packages, not the editable install of this checkout
           "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    ran = []
    for command in readme_commands():
        if command in SLOW:
            continue
        r = subprocess.run(["bash", "-c", command], cwd=fresh_clone, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, f"{command!r} failed ({r.returncode}):\n{r.stderr[-3000:]}"
        ran.append(command)
    smoke = {"python train.py --config configs/tiny.yaml", "python scripts/sweep.py configs/study-quick.yaml"}
    assert smoke <= set(ran)
    # the smoke study shows a newcomer at least one run that learns
    runs = json.loads((fresh_clone / "studies" / "quick" / "sweep.json").read_text())["runs"]
    assert len(runs) == 8 and "ok" in {r["status"] for r in runs}
    assert (fresh_clone / "studies" / "quick" / "report.md").is_file()
    assert (fresh_clone / "exports" / "tiny" / "model.safetensors").is_file()
