"""Config precedence, errors that name the problem, and the ablation flags."""

import pytest
from conftest import imported

import train
from model import Llama
from model.blocks import PostNormBlock, PreNormBlock
from model.norm_config import NORMS
from model.norms import LayerNorm, RMSNorm
from training.config import ConfigError, load_config, to_yaml
from training.outcome import EXIT_BAD_INPUT


def test_precedence_defaults_yaml_cli(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(
        "base: ../../../configs/train/tiny.yaml\noptim: {lr: 1.0e-2, beta2: 0.99}\n".replace(
            "../../../configs", str(train.REPO / "configs")
        )
    )
    cfg = load_config(path, ["optim.lr=5e-3", "train.steps=7"])
    assert cfg.optim.lr == 5e-3  # CLI beats YAML
    assert cfg.optim.beta2 == 0.99  # YAML beats its base and the defaults
    assert cfg.model.dim == 32 and cfg.train.steps == 7  # the base (tiny) and CLI
    assert cfg.optim.beta1 == 0.9 and cfg.data.source == "pydocs"  # defaults through default.yaml
    assert (
        cfg.model.vocab_size == cfg.data.vocab_size == 320
        and cfg.model.max_seq_len == cfg.train.seq_len
    )


def test_a_file_parsed_once_still_reads_its_edits_and_no_result_leaks_into_the_next(tmp_path):
    """load_config parses a file's text once (a study loads it per run): a rewritten file, even
    within the clock's resolution and at the same size, is read anew, and changing one result
    changes no later one."""
    path = tmp_path / "exp.yaml"
    base = f"base: {train.REPO / 'configs' / 'train' / 'tiny.yaml'}\n"
    path.write_text(base + "model: {dim: 48, norm_options: {dyt: {alpha_attn: 0.5}}}\n")
    first = load_config(path, ["model.norm_options.dyt.alpha_attn=0.25"])
    assert first.model.dim == 48 and first.model.norm_options == {"dyt": {"alpha_attn": 0.25}}
    first.model.dim, first.model.norm_options["dyt"]["alpha_attn"] = 7, 3.0
    again = load_config(path)
    assert again.model.dim == 48 and again.model.norm_options == {"dyt": {"alpha_attn": 0.5}}
    path.write_text(base + "model: {dim: 64, norm_options: {dyt: {alpha_attn: 0.5}}}\n")
    assert load_config(path).model.dim == 64
    # the same file and overrides again (merged once a process): a fresh, unchanged result
    same = load_config(path, ["model.norm_options.dyt.alpha_attn=0.25"])
    same.model.norm_options["dyt"]["alpha_attn"], same.optim.lr = 9.0, 1.0
    again = load_config(path, ["model.norm_options.dyt.alpha_attn=0.25"])
    assert again.model.norm_options == {"dyt": {"alpha_attn": 0.25}} and again.optim.lr == 3e-3
    assert load_config(path, values={"train.steps": 1}).train.steps == 1
    with pytest.raises(ConfigError, match="train.steps"):  # True == 1, but not a step count
        load_config(path, values={"train.steps": True})


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "optim.lrr=1",
            "unknown config key 'optim.lrr'; did you mean optim.lr? valid keys in optim: lr, "
            "lr_factor, schedule",
        ),
        (
            "trian.steps=1",
            "unknown config key 'trian'; did you mean train? valid keys: model, data, optim, "
            "train, log",
        ),
        (
            "train.steps=abc",
            "bad value for train.steps: Value 'abc' of type 'str' could not be converted to "
            "Integer",
        ),
        (
            "model.norm=batchnorm",
            f"model.norm='batchnorm' is not one of: {', '.join(sorted(NORMS))}",
        ),
        (
            "model.placement=middle",
            "model.placement='middle' is not one of: deepnorm, hybrid, hybridstar, lns, mixln,",
        ),
        ("train.dtype=fp8", "train.dtype='fp8' is not one of: bfloat16, float16, float32"),
        ("data.source=ftp:x", "data.source: unknown data source 'ftp:x'"),
        ("train.steps=0", "train.steps=0 must be an integer >= 1"),
        ("model.n_heads=3", "model.dim=128 must be divisible by model.n_heads=3"),
        ("optim.lr", "expected key=value overrides"),
        ("model.n_heads=0", "model.n_heads=0 must be an integer >= 1"),
        ("model.init_scale=fan_in", "unknown init_scale 'fan_in'; valid: absolute, width"),
        ("optim.beta2=1.5", "optim.beta2=1.5 must be a finite number in [0, 1)"),
    ],
)
def test_bad_values_raise_one_clear_line(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(train.DEFAULT_CONFIG, [override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_errors_exit_2_with_one_line_and_write_nothing(tmp_path, capsys):
    for argv in (
        ["--norm", "batchnorm"],
        ["--config", str(tmp_path / "missing.yaml")],
        ["train.stepz=3"],
        ["--resume"],
    ):  # (--resume of a run that does not exist starts it: tests/test_faults.py)
        assert train.main([*argv, f"log.out_dir={tmp_path / 'runs'}"]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ")
    assert not (tmp_path / "runs").exists()


def test_norm_and_placement_flags_change_the_model():
    cfg, _, name = train.parse_cli(
        [
            "--config",
            str(train.REPO / "configs/train/tiny.yaml"),
            "--norm",
            "layernorm",
            "--placement",
            "post",
        ]
    )
    model = Llama(cfg.model)
    assert name == "tiny-layernorm-post"
    assert all(isinstance(b, PostNormBlock) for b in model.layers)
    assert isinstance(model.layers[0].attention_norm, LayerNorm)
    cfg, _, _ = train.parse_cli(["--config", str(train.REPO / "configs/train/tiny.yaml")])
    model = Llama(cfg.model)
    assert isinstance(model.layers[0], PreNormBlock) and isinstance(
        model.layers[0].ffn_norm, RMSNorm
    )


def test_resume_may_change_length_not_what_is_trained(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config(train.REPO / "configs/train/tiny.yaml")))
    base = ["--name", "r", "--resume", f"log.out_dir={tmp_path}"]
    cfg, resume, _ = train.parse_cli([*base, "train.steps=50"])
    assert resume and cfg.train.steps == 50 and cfg.model.dim == 32
    for change in (["--norm", "layernorm"], ["optim.weight_decay=0.5"], ["model.dim=64"]):
        with pytest.raises(ConfigError, match="--resume cannot change"):
            train.parse_cli([*base, *change])


def test_lr_schedule_warms_up_then_reaches_the_floor_at_the_last_step():
    from training.optim import lr_at

    cfg = load_config(
        train.DEFAULT_CONFIG, ["optim.lr=1.0", "optim.warmup_steps=5", "optim.min_lr_ratio=0.1"]
    ).optim
    lrs = [lr_at(s, cfg, 20) for s in range(20)]
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0]) and lrs.count(1.0) == 1
    assert lrs[-1] == pytest.approx(0.1) and all(
        a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False)
    )
    # one decay step still ends low
    assert [lr_at(s, cfg, 6) for s in range(6)][-1] == pytest.approx(0.1)


def test_a_norm_or_placement_has_one_registry():
    """Adding a norm is its class and one NORMS entry (a placement: one BLOCKS entry): no other
    module lists their names."""
    from model import args

    assert not [k for k in vars(args) if k.endswith("_NAMES")]


def _train_py(*args: str, cwd):
    """train.py as a user runs it, with Python's import log (which modules loaded) on stderr."""
    import subprocess
    import sys

    cmd = [sys.executable, "-X", "importtime", str(train.REPO / "train.py"), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_help_lists_the_names_and_config_file_errors_come_before_torch(tmp_path):
    r = _train_py("--help", cwd=tmp_path)
    assert r.returncode == 0 and not imported(r.stderr, "torch")
    help_text = " ".join(r.stdout.split())
    assert "model.norm: a name in model/norm_config.py NORMS" in help_text
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  dim: [1, 2\noptim: {lr: 1}\n")
    for args, said in (
        (["--config", "nope.yaml"], "error: config file 'nope.yaml' does not exist"),
        (["--config", str(bad)], f"error: {bad}:3:6: YAML syntax error: did not find expected"),
        (["optim.lrr=1"], "error: unknown config key 'optim.lrr'; did you mean optim.lr?"),
    ):
        r = _train_py(*args, cwd=tmp_path)
        errors = [line for line in r.stderr.splitlines() if not line.startswith("import time:")]
        assert r.returncode == 2 and len(errors) == 1 and errors[0].startswith(said), r.stderr
        assert not imported(r.stderr, "torch")
        assert r.stdout == "" and not (tmp_path / "runs").exists()


def test_a_warmup_as_long_as_the_schedule_is_shortened_and_said(tmp_path, capsys, run_tiny):
    cfg = load_config(train.DEFAULT_CONFIG, ["train.steps=20"])
    assert cfg.optim.warmup_steps == 2 and cfg.optim.schedule_steps == 20
    assert load_config(train.DEFAULT_CONFIG, ["train.steps=31"]).optim.warmup_steps == 30
    frac = load_config(train.DEFAULT_CONFIG, ["optim.warmup_fraction=0.1", "train.steps=1000"])
    assert frac.optim.warmup_steps == 100  # a share of the budget, whatever warmup_steps says
    assert load_config(train.DEFAULT_CONFIG, ["optim.warmup_fraction=0.1"]).optim.warmup_steps == 30
    assert run_tiny("--name", "w", "train.steps=4", "train.eval_every=2") == 0  # tiny: warmup 5
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "note: optim.warmup_steps=5 is not shorter than the schedule's 4 steps (the LR would never "
        "reach optim.lr): warmup shortened to 0 steps, 10% of it"
    ]
    # a warmup set by its share of the budget is not shortened, and no note says it was
    assert run_tiny("--name", "f", "train.steps=4", "optim.warmup_fraction=0.5") == 0
    assert capsys.readouterr().err == ""
    assert run_tiny("--name", "g", "train.steps=4", "optim.warmup_fraction=0.9") == 0  # 3.6 -> 4
    assert capsys.readouterr().err.strip().splitlines() == [
        "note: optim.warmup_fraction=0.9 (4 steps) is not shorter than the schedule's 4 steps (the "
        "LR would never reach optim.lr): warmup shortened to 0 steps, 10% of it"
    ]


def test_every_number_a_config_sets_refuses_nan_inf_and_a_bool_naming_its_key():
    """The numeric fields found by walking the config dataclasses (not a hand list): each declares
    its range beside it, and NaN, inf and YAML's true are refused in one line that names the key."""
    import dataclasses

    from training.config import Config, _numbers

    numbers = list(_numbers(Config()))
    keys = [key for key, _, _, _ in numbers]
    assert len(keys) > 50 and not [key for key, _, _, spec in numbers if spec is None]
    for key in keys:
        for bad in ("nan", "inf", "-inf", "true"):
            with pytest.raises(ConfigError) as e:
                load_config(train.DEFAULT_CONFIG, [f"{key}={bad}"])
            assert str(e.value).startswith(key) or f"for {key}:" in str(e.value), (key, bad)
    for name, cls in NORMS.items():  # each norm's own numeric options, by its Options dataclass
        for f in dataclasses.fields(cls.Options):
            if f.type == "float":
                for bad in ("nan", "inf", "true"):
                    with pytest.raises(ConfigError, match=f"model.norm_options.{name}: {f.name}"):
                        load_config(None, [f"model.norm_options.{name}.{f.name}={bad}"])
