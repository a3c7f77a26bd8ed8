"""Distributed (2-process gloo) checks on CPU: the feature-sharded RMSNorm and LayerNorm equal the
unsharded ones."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY

from model.sharded_norms import shard_sizes
from training.checkpoint import load_sharded, save_sharded

REPO = Path(__file__).resolve().parent.parent


def torchrun(script: str, *args: str, nproc: int = 2) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            "0",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "localhost:0",
            str(REPO / "tests" / "dist" / script),
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]


def test_shard_sizes_split_like_tensor_split_and_refuse_empty_shards():
    assert (
        shard_sizes(12, 2) == [6, 6]
        and shard_sizes(11, 2) == [6, 5]
        and shard_sizes(10, 4) == [3, 3, 2, 2]
    )
    with pytest.raises(ValueError, match="cannot shard a norm over 3 features across 4 ranks"):
        shard_sizes(3, 4)


@pytest.mark.slow
def test_sharded_norms_equal_the_unsharded_ones_on_two_processes(tmp_path):
    torchrun("sharded_norm_check.py", str(tmp_path / "out.json"))
    out = json.loads((tmp_path / "out.json").read_text())
    # even and uneven shards
    for case in ("RMSNorm/12", "RMSNorm/11", "LayerNorm/12", "LayerNorm/11"):
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
    assert out["loss_diff"] < 1e-5 and out["grad_norm_diff"] < 1e-5 and out["param_diff"] < 1e-5, (
        out
    )
    assert (
        max(
            abs(a - b)
            for a, b in zip(out["from_one"], out["ref_losses"][fc.SAVE_AT :], strict=True)
        )
        < 1e-5
    )
    model, opt = fc.fresh()  # the 2 ranks' checkpoint resumed by 1 process
    extra = load_sharded(tmp_path / "ckpt2", model, opt)
    resumed = [fc.step(model, opt, s, slice(None))[0] for s in range(extra["step"], fc.STEPS)]
    assert (
        max(abs(a - b) for a, b in zip(resumed, out["ref_losses"][fc.SAVE_AT :], strict=True))
        < 1e-5
    )


@pytest.mark.slow
def test_tensor_parallel_matches_one_process_for_every_placement(tmp_path):
    """tp = 2 with sequence-parallel norms and qk-norm, the five classic placements, both norms,
    fused kernels on (they step aside for DTensors); qk-LayerNorm under RMSNorm blocks (pre, post),
    with both logit soft-caps; LayerNorm Scaling, Mix-LN, HybridNorm, Derf and gated attention:
    first-step gradient norms within 1e-5 relative, losses and parameters after 4 SGD steps within
    float32 noise."""
    torchrun("tp_check.py", str(tmp_path / "tp.json"))
    out = json.loads((tmp_path / "tp.json").read_text())
    assert (
        len(out) == 19
        and "pre/rmsnorm/qk_norm=layernorm/attn_softcap=1.0/logit_softcap=0.1" in out
        and "hybrid/rmsnorm/qk_norm=none" in out
    )
    for case, d in out.items():
        assert d["loss"] < 1e-5 and d["grad_norm_rel"] < 1e-5 and d["param"] < 1e-4, (case, d)


def _records(run_dir: Path) -> dict[int, dict]:
    return {
        r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    }


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["fsdp", "tp"])
def test_train_py_sharded_run_matches_one_process_and_resumes_on_one(tmp_path, data_args, parallel):
    """torchrun train.py train.parallel=fsdp|tp on 2 processes, stopped at step 4 (a DCP
    checkpoint), resumed by one process: losses and the per-layer metrics equal a one-process run's
    (float32 noise)."""
    import train

    common = [
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=8",
        "train.batch_size=8",
        "train.sample_tokens=0",
        "train.eval_every=4",
        "log.stats_every=4",
        "train.checkpoint_every=4",
    ]
    # fsdp: each rank 4 sequences; tp: all 8
    micro = ["train.micro_batch_size=4"] if parallel == "fsdp" else []
    assert train.main([*common, "--name", "single", *micro]) == 0
    r = _torchrun_train(
        2, *common, "--name", "par", f"train.parallel={parallel}", "train.stop_at=4"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "par" / "checkpoints" / "latest.dcp" / "extra.pt").is_file()
    assert (
        train.main(
            ["--name", "par", "--resume", f"log.out_dir={tmp_path}", "train.parallel=ddp", *micro]
        )
        == 0
    )
    one, par = _records(tmp_path / "single"), _records(tmp_path / "par")
    assert sorted(par) == sorted(one) == list(range(9))
    for step in one:
        for key, value in one[step].items():
            if key.startswith(("train/tokens_per_s", "update/ratio")) or value is None:
                continue  # timing; update ratios of near-zero updates are noise-sized
            if key.startswith("optim/rms_t/") and key not in par[step]:
                continue  # RMS_t is measured on unsharded models only (controls_for)
            assert par[step][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, key)


@pytest.mark.slow
def test_the_readme_multinode_recipe_runs_as_two_nodes_on_loopback(tmp_path, data_args):
    """The README's torchrun --nnodes 2 line, verbatim plus the tiny config, started twice as node 0
    and node 1 on 127.0.0.1: one FSDP run over the two 'machines' whose losses equal one
    process's."""
    from test_readme import MULTINODE, readme_commands

    import train

    assert MULTINODE in readme_commands()
    tiny = [
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=5",
        "train.batch_size=8",
        "train.sample_tokens=0",
    ]
    for _ in range(3):  # a free port can be taken by another job before node 0 binds it: again
        port, run = str(_free_port()), " ".join([*tiny, "--name", "two"])
        command = MULTINODE.replace("29500", port) + " " + run
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
        nodes = [
            subprocess.Popen(
                ["bash", "-c", command],
                cwd=REPO,
                text=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={**env, "NODE_RANK": str(i)},
            )
            for i in range(2)
        ]
        ends = [(node.wait(timeout=600), node.stderr.read()) for node in nodes]
        if not any("address already in use" in err.lower() for _, err in ends):
            break
        shutil.rmtree(tmp_path / "two", ignore_errors=True)
    assert [code for code, _ in ends] == [0, 0], [err[-3000:] for _, err in ends]
    assert train.main([*tiny, "--name", "one", "train.micro_batch_size=4"]) == 0
    one, two = _records(tmp_path / "one"), _records(tmp_path / "two")
    assert json.loads((tmp_path / "two" / "meta.json").read_text())["world_size"] == 2
    assert [two[s]["train/loss"] for s in range(1, 6)] == pytest.approx(
        [one[s]["train/loss"] for s in range(1, 6)], rel=1e-5
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_train(
    nproc: int, *args: str, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """train.py under torchrun on this machine, one thread per process (gloo); env adds
    variables."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "localhost:0",
            "train.py",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


@pytest.mark.slow
def test_four_processes_as_dp2_x_tp2_with_the_defaults_on_equal_one_process(tmp_path, data_args):
    """The 2-D mesh users run: 4 processes, FSDP over 2 data shares x tensor parallel over 2, with
    qk-LayerNorm under RMSNorm blocks, z-loss (its terms logged), clipping, the stability probe
    (attention entropy included), sampling at the end (30 steps at lr 1e-2 learn) and eval over the
    whole val split: losses, grad norms, per-layer metrics and every eval equal one process's within
    float32 noise, and the run exits 0."""
    import train

    common = [
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=30",
        "train.batch_size=8",
        "train.eval_every=10",
        "train.eval_tokens=0",
        "train.checkpoint_every=10",
        "log.stats_every=5",
        "model.qk_norm=layernorm",
        "train.z_loss=1e-4",
        "optim.lr=1e-2",
    ]
    # a data share: 4 sequences
    assert train.main([*common, "--name", "one", "train.micro_batch_size=4"]) == 0
    r = _torchrun_train(4, *common, "--name", "four", "train.parallel=tp", "train.tp_size=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sample: " in r.stdout  # every rank sampled (a collective forward), rank 0 printed
    one, four = _records(tmp_path / "one"), _records(tmp_path / "four")
    assert sorted(four) == sorted(one) == list(range(31))
    # clipping was on and acted (grad norm 1.22 at step 5)
    assert any(four[s]["grad/clipped"] for s in range(1, 31))
    # Over the first steps the two runs agree to float32 rounding (measured <= 6e-7 relative through
    # step 4). Later, rounding differences (reduction orders of sharded matmuls) are amplified by
    # AdamW, which normalizes tiny gradients, and by clipping near its threshold: by step 20 the
    # losses differ by ~1e-5 and one layer's grad norm by 4e-4 relative. A bug (a missing reduction,
    # a wrong shard) shows at step 1 by far more.
    worst = {}
    for step in one:
        for key, value in one[step].items():
            if key.startswith(("train/tokens_per_s", "update/ratio")) or value is None:
                continue  # timing; update ratios of near-zero updates are noise-sized
            if key.startswith("optim/rms_t/") and key not in four[step]:
                continue  # RMS_t is measured on unsharded models only (controls_for)
            if step <= 4:
                tolerance = dict(rel=1e-5, abs=1e-7)
            else:
                tolerance = dict(abs=1e-4) if key.endswith("/loss") else dict(rel=2e-3, abs=1e-6)
            assert four[step][key] == pytest.approx(value, **tolerance), (step, key)
            name = f"{key.split('/layer_')[0]} {'<= 4' if step <= 4 else '> 4'}"
            worst[name] = max(
                worst.get(name, 0), abs(four[step][key] - value) / max(abs(value), 1e-6)
            )
    print(
        "max relative |4 processes - 1 process|:",
        json.dumps({k: f"{v:.1e}" for k, v in sorted(worst.items())}),
    )
    summary = json.loads((tmp_path / "four" / "summary.json").read_text())
    assert (
        summary["status"] == json.loads((tmp_path / "one" / "summary.json").read_text())["status"]
    )


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["fsdp", "tp"])
def test_the_readme_sharded_commands_run_to_their_end_with_the_defaults(
    tmp_path, data_args, parallel
):
    """`torchrun --standalone --nproc_per_node 2 train.py train.parallel=fsdp|tp` as the README has
    them (the tiny config, so it takes seconds; 30 steps so that the run learns and samples):
    default sampling and eval, exit 0, the sample printed once."""
    r = _torchrun_train(
        2,
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "--name",
        "r",
        "optim.lr=1e-2",
        "train.steps=30",
        f"train.parallel={parallel}",
        *(["model.qk_norm=rmsnorm"] if parallel == "tp" else []),
    )  # qk gains: Replicate DTensors
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["status"] == "ok" and r.stdout.count("sample: ") == 1


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["fsdp", "tp"])
def test_dyt_with_its_llama_recipe_trains_sharded(tmp_path, data_args, parallel):
    """DyT's alpha and the embedding's scalar are one-element parameters: FSDP2 refuses 0-dim ones
    ("fully_shard doesn't support scalar parameters", the error DyT runs hit before; tp replicates
    them). The saturated fractions (alpha0 100 before attention saturates ~40% of those units) and
    the trunk's largest gradient, combined over the ranks, equal one process's: each rank's fraction
    is of an equal share (fsdp: half the sequences, tp: half the positions), the gradient maximum is
    over every shard. A unit within float32 noise of |alpha x| = 9 may count on one side in one run
    and the other in the other: 1e-3 is 8 of the 8192 units of a norm at a step."""
    import train

    common = [
        "--config",
        TINY,
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=4",
        "train.eval_every=2",
        "train.sample_tokens=0",
        "log.stats_every=2",
        "model.norm=dyt",
        "model.embed_scale=sqrt_dim",
        "model.norm_options.dyt.bias=false",
        "model.norm_options.dyt.alpha_attn=100",
    ]
    r = _torchrun_train(2, *common, "--name", "d", f"train.parallel={parallel}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["steps"] == 4
    # fsdp: a rank's share is 4 sequences
    micro = ["train.micro_batch_size=4"] if parallel == "fsdp" else []
    assert train.main([*common, "--name", "one", *micro]) == 0
    one, par = _records(tmp_path / "one"), _records(tmp_path / "d")
    for step in (1, 2, 4):
        keys = [k for k in one[step] if k.startswith("dyt/saturated/")]
        assert (
            len(keys) == 2 * 3 + 1 and 0.1 < one[step]["dyt/saturated/layer_0/attention_norm"] < 0.9
        )
        for key in keys:
            assert par[step][key] == pytest.approx(one[step][key], abs=1e-3), (step, key)
        assert par[step]["grad/absmax/trunk"] == pytest.approx(
            one[step]["grad/absmax/trunk"], rel=1e-4
        )


# -- the lifecycle of a sharded run: faults, fallbacks, resumes across kinds, export
# ----------------------------------
LIFE = [
    "--config",
    TINY,
    "train.steps=6",
    "train.batch_size=8",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.sample_tokens=0",
    "optim.lr=1e-2",
]


def _curve(run_dir: Path) -> list[tuple]:
    """What a resume must reproduce: every step's loss and gradient norm and every eval, in
    order."""
    records = sorted(_records(run_dir).items())
    return [(s, r.get("train/loss"), r.get("grad/norm"), r.get("val/loss")) for s, r in records]


def _close(a: list[tuple], b: list[tuple], rel: float) -> bool:
    """The same steps, and every logged value within rel (one process vs two: float32 reduction
    order)."""
    if [x[0] for x in a] != [y[0] for y in b]:
        return False
    pairs = [(u, v) for x, y in zip(a, b, strict=True) for u, v in zip(x[1:], y[1:], strict=True)]
    return all(
        (u is None) == (v is None) and (u is None or u == pytest.approx(v, rel=rel))
        for u, v in pairs
    )


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory, prepared):
    """An uninterrupted 2-process FSDP run of 6 steps (DCP checkpoints at 2, 4, 6): the curve the
    others must give."""
    meta = json.loads((prepared / "meta.json").read_text())
    out = tmp_path_factory.mktemp("ref")
    data = [
        f"data.source={meta['source']}",
        f"data.root={prepared.parent}",
        "data.vocab_size=320",
        "data.val_fraction=0.1",
    ]
    r = _torchrun_train(
        2, *LIFE, *data, f"log.out_dir={out}", "--name", "ref", "train.parallel=fsdp"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "ref", data


@pytest.mark.slow
def test_kill_9_or_a_full_disk_during_a_dcp_save_then_resume_gives_the_uninterrupted_curve(
    tmp_path, fsdp_reference
):
    """SIGKILL on every rank after the second DCP save's shards are written, before the rotation:
    --resume continues from the first and ends on the reference curve bit for bit. A full disk on
    rank 0 at the same moment (before its rotation): one line saying so, rank 0 torchrun's root
    cause with exit 4, the first checkpoint intact, and --resume again ends on the curve."""
    ref, data = fsdp_reference
    for action in ("", ":enospc"):
        name = f"k{action[1:]}"
        args = [*LIFE, *data, f"log.out_dir={tmp_path}", "--name", name, "train.parallel=fsdp"]
        fault = {"NORMLAB_KILL_AT": f"checkpoint:2{action}"}
        fault.update({"NORMLAB_FAULT_RANK": "0"} if action else {})
        r = _torchrun_train(2, *args, env=fault)
        assert r.returncode != 0
        ckpt = tmp_path / name / "checkpoints"
        # the last whole one
        assert torch.load(ckpt / "latest.dcp" / "extra.pt", weights_only=False)["step"] == 2
        if action:
            lines = [
                line for line in r.stderr.splitlines() if "cannot write the run's files" in line
            ]
            assert len(lines) == 1 and "No space left on device" in lines[0], r.stderr[-2000:]
            root = r.stderr.split("Root Cause")[-1]  # torchrun's report: rank 0 first, exit 4
            assert "rank      : 0" in root and "exitcode  : 4" in root, r.stderr[-2000:]
        r = _torchrun_train(2, *args, "--resume")
        assert r.returncode == 0, r.stderr[-3000:]
        # DCP round trip, loader and RNG restored: exact
        assert _curve(tmp_path / name) == _curve(ref), action


@pytest.mark.slow
def test_a_damaged_latest_dcp_falls_back_to_previous_and_a_pt_resumes_onto_fsdp(
    tmp_path, fsdp_reference, capsys
):
    """One process resumes a 2-process FSDP run whose latest.dcp is damaged: from previous.dcp, said
    in one line, ending on the reference curve. And a one-process .pt checkpoint resumes as a
    2-process FSDP run (its full state distributed onto the shards), ending on the same curve."""
    import train

    ref, data = fsdp_reference
    args = [*LIFE, *data, f"log.out_dir={tmp_path}"]
    r = _torchrun_train(2, *args, "--name", "d", "train.parallel=fsdp", "train.stop_at=4")
    assert r.returncode == 0, r.stderr[-3000:]
    for shard in (tmp_path / "d" / "checkpoints" / "latest.dcp").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:64])  # a torn write
    capsys.readouterr()
    assert (
        train.main(
            [
                "--name",
                "d",
                "--resume",
                f"log.out_dir={tmp_path}",
                "train.parallel=ddp",
                "train.micro_batch_size=4",
                "train.stop_at=0",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "latest.dcp cannot be read" in err and "resuming from previous.dcp (step 2)" in err
    assert _close(_curve(tmp_path / "d"), _curve(ref), 1e-5)

    assert train.main([*args, "--name", "p", "train.stop_at=2", "train.micro_batch_size=4"]) == 0
    assert (tmp_path / "p" / "checkpoints" / "latest.pt").is_file()
    r = _torchrun_train(
        2,
        "--name",
        "p",
        "--resume",
        f"log.out_dir={tmp_path}",
        "train.parallel=fsdp",
        "train.micro_batch_size=0",
        "train.stop_at=0",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert _close(_curve(tmp_path / "p"), _curve(ref), 1e-5)


@pytest.mark.slow
def test_a_dcp_only_run_exports_to_transformers_with_the_same_logits(tmp_path, fsdp_reference):
    from transformers import AutoModelForCausalLM

    from training.checkpoint import load_run

    ref, _ = fsdp_reference
    assert not list((ref / "checkpoints").glob("*.pt"))  # only DCP checkpoints
    r = subprocess.run(
        [sys.executable, "-m", "scripts.export_hf", str(ref), str(tmp_path / "hf")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    ours = load_run(ref)[0]
    torch.manual_seed(0)
    # trained weights
    assert not torch.equal(ours.tok_embeddings.weight, type(ours)(ours.args).tok_embeddings.weight)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx)[0], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_fsdp_and_ddp_in_bfloat16_are_the_same_experiment(tmp_path):
    """FSDP's default mixed precision casts every module input to bfloat16 (the residual stream,
    RoPE); autocast, as in one process and DDP, keeps them float32 and casts at the matmuls. Both
    keep them float32 here, and the losses of 4 steps agree within bfloat16 rounding."""
    torchrun("precision_check.py", str(tmp_path / "p.json"))
    out = json.loads((tmp_path / "p.json").read_text())
    assert (
        out["ddp"]["dtypes"]
        == out["fsdp"]["dtypes"]
        == ["rope torch.float32", "stream torch.float32"]
    )
    diffs = [abs(a - b) for a, b in zip(out["ddp"]["losses"], out["fsdp"]["losses"], strict=True)]
    print("ddp - fsdp losses, bfloat16:", diffs)
    assert max(diffs) < 1e-2  # bfloat16 has 8 bits of mantissa: ~4e-3 relative per rounding
