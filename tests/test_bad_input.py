"""The bad-input catalog: every class of bad config, command line, data source and study file ends
in one line on stderr that names the field or file and what is allowed, a non-zero exit, no
traceback, nothing written."""

import os

import pytest
from conftest import TINY

import train
from lab.sweep import sweep

# (case, file contents or None, extra arguments, what the line must say); {f} is the bad file's path
CONFIGS = [
    ("not yaml", "model: {dim: [32\n", [], "YAML syntax error"),
    ("binary", b"\x00\xff\xfe PK\x03\x04", [], "cannot parse"),
    ("a list", "- model\n- data\n", [], "must be a mapping"),
    ("a scalar", "42\n", [], "must be a mapping"),
    ("section as a scalar", "model: 5\n", [], "'model' must be a mapping of its fields"),
    ("field as a mapping", "model: {dim: {a: 1}}\n", [], "model.dim"),
    ("unknown section", "modle: {dim: 32}\n", [], "unknown config key 'modle'"),
    ("unknown field", "train: {stepz: 3}\n", [], "unknown config key 'train.stepz'"),
    ("missing base", "base: nowhere.yaml\n", [], "does not exist"),
    ("a directory", None, ["--config", "{dir}"], "is not a file"),
    ("missing file", None, ["--config", "{dir}/missing.yaml"], "does not exist"),
]
FIELDS = [
    ("train.steps=abc", "train.steps"),
    ("train.steps=-1", "train.steps=-1 must be an integer >= 1"),
    ("optim.lr=0", "optim.lr=0.0 must be a finite number > 0"),
    ("model.norm=batchnorm", "model.norm='batchnorm' is not one of"),
    ("model.placement=middle", "model.placement='middle' is not one of"),
    ("train.dtype=float8", "train.dtype='float8' is not one of"),
    ("optim.schedule=step", "optim.schedule"),
    ("log.wandb=maybe", "log.wandb"),
    ("train.device=tpu", "train.device"),
    ("model.dim=30", "model.dim=30 must be divisible by model.n_heads=4"),
    ("model.n_kv_heads=3", "n_kv_heads"),
    ("model.ffn_dim_multiplier=0", "ffn_dim_multiplier"),
    ("optim.beta1=1.5", "optim.beta1"),
    (
        "train.micro_batch_size=3",
        "train.batch_size=8 must be a multiple of train.micro_batch_size=3",
    ),
    ("log.spike_window=1", "log.spike_window"),
    ("data.vocab_size=100", "data.vocab_size must be >= 300"),
    ("data.val_fraction=1.5", "data.val_fraction=1.5 must be a finite number in (0, 1)"),
    ("train.seq_len=0", "train.seq_len"),
    ("data.source=ftp:x", "unknown data source 'ftp:x'"),
    ("train.eval_every=0", "train.eval_every=0 must be an integer >= 1"),
    ("steps=3", "unknown config key 'steps'"),
    ("optim.lr", "expected key=value"),
    # too big for any machine: refused before it starts
    ("train.seq_len=100000000", "more memory per process"),
    ("train.tp_size=0", "train.tp_size=0 must be an integer >= 1"),
]
SOURCES = [  # text sources: (file contents, or a directory)
    ("missing", None, "matches no files"),
    ("empty", b"", "non-empty documents"),
    ("whitespace only", b"  \n\n\t\n  \n", "non-empty documents"),
    ("binary", bytes(range(256)) * 64, "not UTF-8 text"),
    ("a directory", "dir", "matches no files"),
]
STUDIES = [
    ("not yaml", "grid: [1, 2\n", "cannot parse"),
    ("not a mapping", "- 1\n", "a 'grid' mapping"),
    ("grid not a mapping", "grid: [1, 2]\n", "a 'grid' mapping"),
    ("grid value not a list", "grid: {lr: 0.1}\n", "grid.lr must be a non-empty list"),
    ("unknown key", "grid: {lr: [0.1]}\nworkerz: 2\n", "unknown study key(s) workerz"),
    (
        "bad grid value",
        f"config: {TINY}\ngrid: {{norm: [rmsnorm, groupnorm]}}\n",
        "model.norm='groupnorm'",
    ),
    ("unknown grid field", f"config: {TINY}\ngrid: {{model.dimm: [1]}}\n", "model.dimm"),
    (
        "bad override type",
        f"config: {TINY}\noverrides: {{train: {{steps: many}}}}\ngrid: {{lr: [0.1]}}\n",
        "train.steps",
    ),
    ("missing config", "config: nowhere.yaml\ngrid: {lr: [0.1]}\n", "does not exist"),
    ("threads zero", "grid: {lr: [0.1]}\nthreads_per_worker: 0\n", "must be an integer >= 1"),
    ("threads not a number", "grid: {lr: [0.1]}\nthreads_per_worker: two\n", "threads_per_worker"),
]


def _one_line(capsys, code, must_say):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: ") and must_say in err[0], err
    return err[0]


@pytest.mark.parametrize("case,text,args,must_say", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_bad_config_files(tmp_path, capsys, case, text, args, must_say):
    path = tmp_path / "bad.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    args = [a.format(dir=tmp_path) for a in args] or ["--config", str(path)]
    line = _one_line(capsys, train.main([*args, f"log.out_dir={tmp_path / 'runs'}"]), must_say)
    assert "Traceback" not in line and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("override,must_say", FIELDS, ids=[f[0] for f in FIELDS])
def test_bad_fields(tmp_path, capsys, data_args, override, must_say):
    code = train.main(["--config", TINY, f"log.out_dir={tmp_path / 'runs'}", *data_args, override])
    _one_line(capsys, code, must_say)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case,content,must_say", SOURCES, ids=[s[0] for s in SOURCES])
def test_bad_data_sources(tmp_path, capsys, case, content, must_say):
    path = tmp_path / "corpus.txt"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    code = train.main(
        [
            "--config",
            TINY,
            f"log.out_dir={tmp_path / 'runs'}",
            f"data.source=text:{path}",
            f"data.root={tmp_path / 'prepared'}",
        ]
    )
    line = _one_line(capsys, code, must_say)
    assert str(path) in line  # names the file
    assert not (tmp_path / "runs").exists()
    prepared = tmp_path / "prepared"
    assert not prepared.exists() or not [
        p for p in prepared.iterdir() if p.is_dir()
    ]  # no half-prepared data


@pytest.mark.parametrize("case,text,must_say", STUDIES, ids=[s[0] for s in STUDIES])
def test_bad_study_files(tmp_path, capsys, case, text, must_say):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    _one_line(capsys, sweep([str(path), "--out", str(tmp_path / "out")]), must_say)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_sweep_refuses_workers_below_one(tmp_path, capsys, workers):
    path = tmp_path / "study.yaml"
    path.write_text(f"config: {TINY}\ngrid: {{lr: [0.1]}}\n")
    with pytest.raises(SystemExit) as e:  # the one rule for every tool's arguments (argparse's)
        sweep([str(path), "--out", str(tmp_path / "out"), "--workers", workers])
    assert e.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(  # one line, not argparse's usage first
        f"error: argument --workers: {workers} must be an integer >= 1 (see python -m lab.sweep"
    ), said
    assert not (tmp_path / "out").exists()


def test_the_catalog_is_large():
    assert len(CONFIGS) + len(FIELDS) + len(SOURCES) + len(STUDIES) >= 30
    assert os.environ.get("NORMLAB_KILL_AT") is None
