"""Distributed (2-process gloo) checks on CPU: the feature-sharded RMSNorm and LayerNorm equal the unsharded ones."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from model.sharded_norms import shard_sizes
from training.parallel import load_sharded, save_sharded

REPO = Path(__file__).resolve().parent.parent


def torchrun(script: str, *args: str, nproc: int = 2) -> None:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                        "--master_port", "0", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
                        str(REPO / "tests" / "dist" / script), *args], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]


def test_shard_sizes_split_like_tensor_split_and_refuse_empty_shards():
    assert shard_sizes(12, 2) == [6, 6] and shard_sizes(11, 2) == [6, 5] and shard_sizes(10, 4) == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="cannot shard a norm over 3 features across 4 ranks"):
        shard_sizes(3, 4)


@pytest.mark.slow
def test_sharded_norms_equal_the_unsharded_ones_on_two_processes(tmp_path):
    torchrun("sharded_norm_check.py", str(tmp_path / "out.json"))
    out = json.loads((tmp_path / "out.json").read_text())
    for case in ("RMSNorm/12", "RMSNorm/11", "LayerNorm/12", "LayerNorm/11"):  # even and uneven shards
        assert max(out[case].values()) < 1e-5, (case, out[case])
    assert "every rank needs >= 1 feature" in out["too_few"]


def _fsdp_check_module():
    sys.path.insert(0, str(REPO / "tests" / "dist"))
    try:
        import fsdp_check
    finally:
        sys.path.pop(0)
    return fsdp_check


@pytest.mark.slow
def test_fsdp_matches_one_process_and_dcp_checkpoints_reshard_both_ways(tmp_path):
    fc = _fsdp_check_module()
    model, opt = fc.fresh()  # a 1-process DCP checkpoint at step 3, for the 2 ranks to resume
    for s in range(fc.SAVE_AT):
        fc.step(model, opt, s, slice(None))
    save_sharded(tmp_path / "ckpt1", model, opt, {"step": fc.SAVE_AT})
    torchrun("fsdp_check.py", str(tmp_path))
    out = json.loads((tmp_path / "fsdp.json").read_text())
    assert out["sharded"] == "DTensor"  # FSDP2 really sharded the parameters
    assert out["loss_diff"] < 1e-5 and out["grad_norm_diff"] < 1e-5 and out["param_diff"] < 1e-5, out
    assert max(abs(a - b) for a, b in zip(out["from_one"], out["ref_losses"][fc.SAVE_AT:], strict=True)) < 1e-5
    model, opt = fc.fresh()  # the 2 ranks' checkpoint resumed by 1 process
    extra = load_sharded(tmp_path / "ckpt2", model, opt)
    resumed = [fc.step(model, opt, s, slice(None))[0] for s in range(extra["step"], fc.STEPS)]
    assert max(abs(a - b) for a, b in zip(resumed, out["ref_losses"][fc.SAVE_AT:], strict=True)) < 1e-5
