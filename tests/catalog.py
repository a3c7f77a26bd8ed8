"""Issue 78's catalog of bad inputs, run as commands (a real full disk: a 64 kB tmpfs, so root):
each case's exit code, stderr lines, traceback or not, last line, against the expected code.

    python tests/catalog.py REPO OUT.md

Not a test module (pytest collects test_*.py): tests/test_errors.py checks the same classes
in-process."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(sys.argv[1])
OUT = Path(sys.argv[2])
C = Path("/tmp/cat")
FULL = C / "full"
PY = sys.executable
ENV = {
    **os.environ,
    "PYTHONPATH": str(REPO),
    "WANDB_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def sh(cmd, timeout=300):
    r = subprocess.run(
        ["bash", "-c", cmd], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    return r


def setup():
    subprocess.run(["umount", str(FULL)], capture_output=True)
    shutil.rmtree(C, ignore_errors=True)
    (C / "runs").mkdir(parents=True)
    for name, norm in (("ok", "rmsnorm"), ("ln", "layernorm")):
        r = sh(
            f"{PY} train.py --config configs/train/tiny.yaml --norm {norm} --name {name} "
            f"log.out_dir={C}/runs train.checkpoint_every=10"
        )
        assert r.returncode == 0, r.stderr[-2000:]
    shutil.copytree(C / "runs/ok", C / "runs/nockpt")
    shutil.rmtree(C / "runs/nockpt/checkpoints")
    shutil.copytree(C / "runs/ok", C / "runs/badckpt")
    p = C / "runs/badckpt/checkpoints/latest.pt"
    p.write_bytes(p.read_bytes()[:1000])
    for f in (C / "runs/badckpt/checkpoints").glob("previous*"):
        f.unlink()
    shutil.copytree(C / "runs/ok", C / "runs/badcfg")
    (C / "runs/badcfg/config.yaml").write_text("model: {dim: [\n")
    shutil.copytree(C / "runs/ok", C / "runs/badsum")
    (C / "runs/badsum/summary.json").write_text('{"status": "ok",')
    (C / "file").write_text("x")
    (C / "empty").mkdir()
    (C / "hfnoweights").mkdir()
    (C / "hfnoweights/config.json").write_text(
        json.dumps(
            {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 64}
        )
    )
    (C / "bad.yaml").write_text("model:\n  dim: [1, 2\n")
    (C / "study-dup.yaml").write_text(
        textwrap.dedent("""
        name: study-dup
        about: "dup seeds"
        config: tiny.yaml
        grid: {norm: [rmsnorm], lr: [1.0e-3]}
        protocol: {selection_seeds: [0, 1], test_seeds: [2, 2, 3]}
        """)
    )
    (C / "study-bad.yaml").write_text("name: x\ngrid: [1,\n")
    (C / "study-key.yaml").write_text(
        "name: study-key\nabout: x\ngrid: {norm: [rmsnorm], seed: [0]}\nfoo: 1\n"
    )
    (C / "tiny-text.txt").write_text(
        "\n\n".join(f"paragraph {i}: a few short words." for i in range(40))
    )
    # a packed part, truncated
    (C / "pending/quick").mkdir(parents=True)
    (C / "pending/quick/part-001.tar.xz").write_bytes(b"\xfd7zXZ\x00\x00" + b"0" * 50)
    (C / "noparts").mkdir()
    shutil.copytree(REPO / "lab/results/critical-lr-control", C / "results/critical-lr-control")
    (C / "results/critical-lr-control/runs.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    (C / "cmp").mkdir()
    for n in ("ok", "ln"):
        shutil.copytree(C / "runs" / n, C / "cmp" / n)
    r = sh(f"{PY} -m lab.sweep lab/studies/quick.yaml --out {C}/studies --no-report")
    assert r.returncode == 0, r.stderr[-2000:]
    (C / "readme.md").write_text("# x\n<!-- found: lab/results -->\n<!-- /found -->\n")
    FULL.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(FULL)], check=True)
    (FULL / "fill").write_bytes(b"0" * 60000)


T = f"{PY} train.py --config configs/train/tiny.yaml log.out_dir={C}/runs"
CASES = [
    ("train.py", "unknown key", f"{T} foo.bar=1", 2),
    ("train.py", "a bad value", f"{T} optim.lr=-1", 2),
    ("train.py", "missing config", f"{PY} train.py --config {C}/nope.yaml", 2),
    ("train.py", "config not YAML", f"{PY} train.py --config {C}/bad.yaml", 2),
    ("train.py", "--resume without --name", f"{T} --resume", 2),
    (
        "train.py",
        "explicit max_seq_len below seq_len",
        f"{T} --name c1 model.max_seq_len=16 train.seq_len=32",
        2,
    ),
    (
        "train.py",
        "a window longer than the data",
        f"{T} --name c2 data.source=text:{C}/tiny-text.txt train.seq_len=512 model.max_seq_len=512",
        2,
    ),
    (
        "train.py",
        "explicit attention's scores beyond memory",
        f"{T} --name c3 train.seq_len=32768 train.batch_size=8 model.n_heads=4 "
        "model.n_kv_heads=4 model.attn_softcap=30",
        2,
    ),
    (
        "train.py",
        "out_dir on a full disk",
        f"{PY} train.py --config configs/train/tiny.yaml log.out_dir={FULL}/runs --name c4",
        4,
    ),
    (
        "train.py",
        "out_dir is a file",
        f"{PY} train.py --config configs/train/tiny.yaml log.out_dir={C}/file --name c5",
        2,
    ),
    ("sample", "run missing", f"{PY} -m scripts.sample {C}/runs/nope", 2),
    ("sample", "no checkpoint", f"{PY} -m scripts.sample {C}/runs/nockpt", 2),
    ("sample", "truncated checkpoint", f"{PY} -m scripts.sample {C}/runs/badckpt", 2),
    ("sample", "bad --tokens", f"{PY} -m scripts.sample {C}/runs/ok --tokens -1", 2),
    ("sample", "config not YAML", f"{PY} -m scripts.sample {C}/runs/badcfg", 2),
    ("export_hf", "run missing", f"{PY} -m scripts.export_hf {C}/runs/nope {C}/exp1", 2),
    ("export_hf", "out is a file", f"{PY} -m scripts.export_hf {C}/runs/ok {C}/file", 2),
    ("export_hf", "out on a full disk", f"{PY} -m scripts.export_hf {C}/runs/ok {FULL}/exp", 4),
    ("export_hf", "config not YAML", f"{PY} -m scripts.export_hf {C}/runs/badcfg {C}/exp2", 2),
    ("export_hf", "no checkpoint", f"{PY} -m scripts.export_hf {C}/runs/nockpt {C}/exp3", 2),
    ("convert_norms", "an RMSNorm run", f"{PY} -m scripts.convert_norms {C}/runs/ok {C}/cv1", 2),
    ("convert_norms", "run missing", f"{PY} -m scripts.convert_norms {C}/runs/nope {C}/cv2", 2),
    (
        "convert_norms",
        "--hf folder with a config, no weights",
        f"{PY} -m scripts.convert_norms --hf {C}/hfnoweights {C}/g.pt",
        2,
    ),
    (
        "convert_norms",
        "--hf folder missing",
        f"{PY} -m scripts.convert_norms --hf {C}/nohf {C}/g2.pt",
        2,
    ),
    ("convert_norms", "out is a file", f"{PY} -m scripts.convert_norms {C}/runs/ln {C}/file", 2),
    (
        "convert_norms",
        "out on a full disk",
        f"{PY} -m scripts.convert_norms {C}/runs/ln {FULL}/cv",
        4,
    ),
    ("inspect", "folder missing", f"{PY} -m normlab.inspect {C}/nope", 2),
    ("inspect", "an empty folder", f"{PY} -m normlab.inspect {C}/empty", 2),
    ("inspect", "config not YAML", f"{PY} -m normlab.inspect {C}/runs/badcfg --out {C}/i1", 2),
    ("inspect", "summary not JSON", f"{PY} -m normlab.inspect {C}/runs/badsum --out {C}/i2", 2),
    (
        "inspect",
        "--out inside the run",
        f"{PY} -m normlab.inspect {C}/runs/ok --out {C}/runs/ok/x",
        2,
    ),
    ("inspect", "--out is a file", f"{PY} -m normlab.inspect {C}/runs/ok --out {C}/file", 2),
    (
        "inspect",
        "--out on a full disk",
        f"{PY} -m normlab.inspect {C}/runs/ok --out {FULL}/page",
        4,
    ),
    ("lab.sweep", "study missing", f"{PY} -m lab.sweep {C}/nope.yaml", 2),
    ("lab.sweep", "study not YAML", f"{PY} -m lab.sweep {C}/study-bad.yaml", 2),
    ("lab.sweep", "unknown study key", f"{PY} -m lab.sweep {C}/study-key.yaml", 2),
    (
        "lab.sweep",
        "a seed twice in a protocol list",
        f"{PY} -m lab.sweep {C}/study-dup.yaml --dry-run",
        2,
    ),
    ("lab.sweep", "--workers 0", f"{PY} -m lab.sweep lab/studies/quick.yaml --workers 0", 2),
    (
        "lab.sweep",
        "--out on a full disk",
        f"{PY} -m lab.sweep lab/studies/quick.yaml --out {FULL}/studies",
        4,
    ),
    ("lab.sweep", "--out is a file", f"{PY} -m lab.sweep lab/studies/quick.yaml --out {C}/file", 2),
    ("lab.compare", "folder missing", f"{PY} -m lab.compare {C}/nope", 2),
    ("lab.compare", "a folder with no runs", f"{PY} -m lab.compare {C}/empty", 2),
    ("lab.compare", "--out on a full disk", f"{PY} -m lab.compare {C}/cmp --out {FULL}/rep", 4),
    ("lab.redecide", "a folder without a study file", f"{PY} -m lab.redecide {C}/empty", 2),
    (
        "lab.redecide",
        "damaged runs.json.gz",
        f"{PY} -m lab.redecide {C}/results/critical-lr-control",
        2,
    ),
    ("lab.readme", "--results missing", f"{PY} -m lab.readme --results {C}/nope", 2),
    ("lab.readme", "--results is a file", f"{PY} -m lab.readme --results {C}/file", 2),
    (
        "lab.pack",
        "unpack a truncated part",
        f"{PY} -m lab.pack --unpack {C}/pending/quick --out {C}/unpacked",
        2,
    ),
    (
        "lab.pack",
        "unpack a folder with no parts",
        f"{PY} -m lab.pack --unpack {C}/noparts --out {C}/studies",
        2,
    ),
    ("lab.pack", "pack a folder that is no study", f"{PY} -m lab.pack {C}/empty {C}/pending", 2),
    ("lab.pack", "pack onto a full disk", f"{PY} -m lab.pack {C}/studies/quick {FULL}/pending", 4),
]


def main():
    setup()
    rows = []
    try:
        for tool, case, cmd, want in CASES:
            try:
                r = sh(cmd)
                err = [line for line in r.stderr.strip().splitlines() if line.strip()]
                last = err[-1] if err else (r.stdout.strip().splitlines() or [""])[-1]
                tb = "Traceback" in r.stderr
                lines = len(err)
                rows.append((tool, case, r.returncode, want, lines, tb, last[:160], cmd))
            except subprocess.TimeoutExpired:
                rows.append((tool, case, "timeout", want, 0, False, "(ran past 300 s)", cmd))
            print(rows[-1][:7], flush=True)
    finally:
        subprocess.run(["umount", str(FULL)], capture_output=True)
    ok = sum(1 for r in rows if r[2] == r[3] and r[4] == 1 and not r[5])
    text = [
        f"{ok} of {len(rows)} cases: the expected code, one line on stderr, no traceback",
        "",
        "| tool | case | exit | expected | stderr lines | traceback | last line |",
        "|---|---|---|---|---|---|---|",
    ]
    for tool, case, code, want, lines, tb, last, _cmd in rows:
        shown = last.replace("|", "/")
        traceback = "yes" if tb else "no"
        text.append(f"| {tool} | {case} | {code} | {want} | {lines} | {traceback} | {shown} |")
    OUT.write_text("\n".join(text) + "\n")
    print(text[0])


main()
