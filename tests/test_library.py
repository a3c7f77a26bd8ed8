"""The library (normlab/): one import name, torch its only hard dependency; one monitor for
normlab's model and any other (a transformers Llama and GPT-2 built from config objects, no
download); a plain loop, transformers' Trainer and Lightning; hooks that only read."""

import ast
import copy
import json
import math
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch
from conftest import tiny_args

from model import Llama
from normlab import Monitor, StabilityProbe, find_layout, normlab_layout
from normlab import inspect as inspect_page
from normlab.runs import read_run

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "normlab"
VOCAB = 96


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config)


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, bos_token_id=0,
        eos_token_id=1, loss_type="ForCausalLM",
    )  # fmt: skip
    return GPT2LMHeadModel(config)


MODELS = {"llama": hf_llama, "gpt2": hf_gpt2}


def batch(seed: int = 0, n: int = 4, t: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


def test_installing_normlab_adds_one_top_level_name():
    """pyproject's packages are normlab's alone (no model, data, training, fused, lab or train a
    user's project could clash with)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["normlab", "normlab.*"]
    assert "py-modules" not in project["tool"]["setuptools"]
    assert project["project"]["dependencies"] == ["torch>=2.4"]


@pytest.mark.slow  # a fresh interpreter importing torch
def test_a_project_with_its_own_model_and_data_uses_the_monitor(tmp_path):
    """A user's project with its own model.py and data/ package imports normlab's monitor; its own
    modules stay its own, and normlab brings none of the checkout's."""
    (tmp_path / "model.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            WHO = "user"

            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.norm = nn.LayerNorm(16)
                    self.fc = nn.Linear(16, 16)

                def forward(self, x):
                    return x + self.fc(self.norm(x))

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed = nn.Embedding(32, 16)
                    self.blocks = nn.ModuleList(Block() for _ in range(3))
                    self.final = nn.LayerNorm(16)
                    self.head = nn.Linear(16, 32)

                def forward(self, idx):
                    x = self.embed(idx)
                    for b in self.blocks:
                        x = b(x)
                    return self.head(self.final(x))
            """
        )
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text('WHO = "user"\n')
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        import torch
        import model, data
        from normlab import Monitor
        assert model.WHO == data.WHO == "user"
        net = model.Net()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        mon = Monitor(net, "run", every=1, tensorboard=False)
        idx = torch.randint(0, 32, (2, 8))
        with mon.step(1):
            loss = torch.nn.functional.cross_entropy(net(idx).flatten(0, 1), idx.flatten())
            loss.backward()
            opt.step()
            mon.log(loss=loss)
        mon.close()
        assert not {"training", "fused", "lab", "train"} & set(sys.modules)
        assert Path(model.__file__).parent == Path.cwd()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what pip installed
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert records[0]["step"] == 1 and "grad/norm/layer_2" in records[0]
    assert "norm_in/mean_energy/layer_0" in records[0] and "train/loss" in records[0]


STDLIB = set(sys.stdlib_module_names)
# optional dependencies, each where the library uses it (imported lazily, or its integration's own)
OPTIONAL = {
    "hf.py": {"transformers"},
    "lightning.py": {"lightning"},
    "inspect.py": {"matplotlib"},
    "runs.py": {"yaml", "tensorboard"},
}


@pytest.mark.parametrize("path", sorted(LIBRARY.glob("*.py")), ids=lambda p: p.name)
def test_the_library_needs_torch_alone(path):
    """Each file imports the standard library, torch and normlab; an optional package only in the
    file that integrates it; nothing of the checkout (train, model, training, data, fused, lab)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    extra = found - STDLIB - {"torch", "normlab"} - OPTIONAL.get(path.name, set())
    assert not extra, f"normlab/{path.name} imports {sorted(extra)}"


def _probed_step(model, probe, x, y=None, clip=None):
    """One step of normlab's model or a transformers one with the probe's hooks; (logits, grads,
    metrics)."""
    probe.snapshot()
    probe.attach(logits=True)
    if isinstance(model, Llama):
        logits, loss = model(x[:, :-1], x[:, 1:])
    else:
        out = model(input_ids=x, labels=x)
        logits, loss = out.logits, out.loss
    loss.backward()
    probe.record_grads(others=True)
    grads = [p.grad.clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
    return logits.detach(), grads, probe.finish()


def test_the_generic_layout_gives_the_normlab_layouts_values_on_normlab_model():
    """find_layout (the longest ModuleList, norms as wide as the stream, attention from SDPA
    calls) on normlab's Llama: the normlab layout's values (1e-6) on every key, none missing."""
    torch.manual_seed(0)
    model = Llama(tiny_args(n_layers=3, vocab_size=VOCAB, max_seq_len=16))
    x = batch(1, t=17)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    _, _, ours = _probed_step(a, StabilityProbe(a, layout=normlab_layout(a)), x)
    _, _, generic = _probed_step(b, StabilityProbe(b, layout=find_layout(b)), x)
    assert set(ours) <= set(generic), sorted(set(ours) - set(generic))
    assert {k.split("/")[0] for k in ours} >= {"grad", "update", "act", "norm_in", "attn", "logits"}
    worst = max(abs(generic[k] - v) / max(abs(v), 1e-12) for k, v in ours.items())
    print(f"largest relative difference over {len(ours)} keys: {worst:.2e}")
    assert worst <= 1e-6, worst


@pytest.mark.parametrize("name", list(MODELS))
def test_the_monitor_finds_a_transformers_models_parts(name):
    model = MODELS[name]()
    layout = find_layout(model)
    assert len(layout.blocks) == 3 and all(len(n) == 2 for n in layout.norms)
    assert layout.final_norm is not None
    _, _, metrics = _probed_step(model, StabilityProbe(model), batch())
    for i in range(3):
        for key in ("grad/norm", "update/ratio", "act/rms", "norm_in/mean_energy", "norm/gain"):
            assert math.isfinite(metrics[f"{key}/layer_{i}"]), key
        assert metrics[f"attn/logit_max/layer_{i}"] > 0
        assert 0 < metrics[f"attn/entropy/layer_{i}"] < math.log(16)
    assert metrics["grad/norm/embed"] > 0 and metrics["logits/max"] > 0
    # block 0's first norm: the mean-energy fraction of what it received, recomputed
    name0, first = next(iter(layout.norms[0].items()))
    seen = []
    handle = first.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().double()))
    probe = StabilityProbe(model)
    probe.attach()
    with torch.no_grad():
        model(input_ids=batch(5))
    got = probe.finish()[f"norm_in/mean_energy/layer_0/{name0}"]
    handle.remove()
    x = seen[0]
    assert got == pytest.approx((x.mean(-1).pow(2).mean() / x.pow(2).mean()).item(), rel=1e-5)


@pytest.mark.parametrize("name", ["llama", "gpt2", "normlab"])
def test_the_monitors_hooks_only_read(name):
    """Logits and every gradient bitwise the same with and without a probed step."""
    x = batch(3, t=17)
    runs = []
    for monitored in (False, True):
        if name == "normlab":
            torch.manual_seed(0)
            model = Llama(tiny_args(n_layers=3, vocab_size=VOCAB, max_seq_len=16))
        else:
            model = MODELS[name]()
        mon = Monitor(model, every=1)
        if monitored:
            mon.start(1)
        if name == "normlab":
            logits, loss = model(x[:, :-1], x[:, 1:])
        else:
            out = model(input_ids=x, labels=x)
            logits, loss = out.logits, out.loss
        loss.backward()
        if monitored:
            record = mon.end()
            assert record["grad/norm"] > 0 and "attn/logit_max/layer_0" in record
            assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
        runs.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (l0, g0), (l1, g1) = runs
    assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))


def test_a_plain_loop_logs_pre_clip_norms_with_accumulation_and_spikes(tmp_path):
    """Two micro-batches a step, clipping at 1e-3: the logged grad/norm is the whole step's
    gradient norm before clipping (torch's get_total_norm, taken before the clip); metrics.jsonl,
    TensorBoard events and summary.json are in the folder, and the inspect page reads it."""
    model = hf_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = Monitor(model, tmp_path / "run", every=2)
    before = {}
    for step in range(1, 7):
        with mon.step(step):
            for micro in range(2):
                x = batch(10 * step + micro, n=2)
                loss = model(input_ids=x, labels=x).loss / 2
                loss.backward()
            params = [p for p in model.parameters() if p.grad is not None]
            before[step] = torch.nn.utils.get_total_norm([p.grad for p in params]).item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss * 2)
    mon.close()
    records = {r["step"]: r for r in map(json.loads, (tmp_path / "run/metrics.jsonl").open())}
    assert sorted(records) == [1, 2, 3, 4, 5, 6]
    for step in (1, 2, 4, 6):  # step 1 and every 2nd
        assert records[step]["grad/norm"] == pytest.approx(before[step], rel=1e-5)
        assert records[step]["grad/norm"] > 1e-3 * 10  # before the clip
    assert "grad/norm" not in records[3] and "train/loss" in records[3]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["spikes/loss"] == [] and summary["steps"] == 6
    assert list((tmp_path / "run").glob("events.out.tfevents.*"))
    assert inspect_page.main([str(tmp_path / "run"), "--out", str(tmp_path / "page")]) == 0
    assert "| run |" in (tmp_path / "page/page.md").read_text()


def _trainer(model, out: Path, steps: int = 10):
    """transformers' Trainer on random tokens: 2 micro-batches a step, clipping at 1e-3."""
    from transformers import Trainer, TrainingArguments

    data = [{"input_ids": batch(i, n=1)[0], "labels": batch(i, n=1)[0]} for i in range(64)]
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        max_grad_norm=1e-3,  # every step clips: the norms must be the ones before
        logging_steps=2,
        report_to=["tensorboard"],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    return Trainer(model=model, args=args, train_dataset=data)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_in_transformers_trainer_the_layer_norms_add_up_to_its_grad_norm(name, tmp_path, capsys):
    """About 10 steps of transformers' Trainer with the callback and forced clipping: on every
    logged step the per-part pre-clip norms' root-sum-square is the Trainer's own grad_norm; the
    metrics reach its TensorBoard reporter; the inspect page renders from the output folder, from
    normlab/metrics.jsonl or from the event files alone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from normlab.hf import add_monitor

    trainer = _trainer(MODELS[name](), tmp_path / "out")
    add_monitor(trainer)
    trainer.train()
    printed = capsys.readouterr().out
    assert "'grad_norm'" in printed and "grad/norm/layer_0" not in printed  # the console: quiet
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    assert [h["step"] for h in logged] == [2, 4, 6, 8, 10]
    for h in logged:
        parts = [v for k, v in h.items() if k.startswith("grad/norm/")]
        assert len(parts) >= 5  # 3 layers, the embedding(s), the rest
        assert math.sqrt(sum(v * v for v in parts)) == pytest.approx(h["grad_norm"], rel=1e-5)
        assert h["grad_norm"] > 1e-3  # it clipped
    folders = {f.parent for f in (tmp_path / "out").rglob("events.out.tfevents.*")}
    assert len(folders) == 1
    acc = EventAccumulator(str(folders.pop()))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/grad_norm", "train/grad/norm/layer_0", "train/attn/logit_max/layer_2",
                "train/norm_in/mean_energy/layer_1", "train/update/ratio/layer_0"):  # fmt: skip
        assert tag in tags, sorted(tags)
    run = read_run(tmp_path / "out")
    assert run.source == "normlab/metrics.jsonl"
    assert run.points("grad/norm/layer_0")[0] == [2, 4, 6, 8, 10]
    page = tmp_path / "page"
    assert inspect_page.main([str(tmp_path / "out"), "--out", str(page)]) == 0
    assert "normlab/metrics.jsonl" in (page / "page.md").read_text()
    (tmp_path / "out" / "normlab" / "metrics.jsonl").unlink()  # the event files alone
    events = read_run(tmp_path / "out")
    assert events.source == "TensorBoard events"
    assert events.points("grad/norm/layer_0")[0] == [2, 4, 6, 8, 10]
    assert events.points("train/loss")[0] == [2, 4, 6, 8, 10]


@pytest.mark.slow
def test_a_lightning_run_logs_the_metrics_before_lightning_clips(tmp_path):
    import lightning as L  # requirements-dev.txt
    from lightning.pytorch.loggers import CSVLogger

    from normlab.lightning import StabilityCallback

    seen = {}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = hf_llama()

        def training_step(self, x, i):
            return self.model(input_ids=x, labels=x).loss

        def on_before_optimizer_step(self, optimizer):  # before Lightning clips
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            seen[self.trainer.global_step + 1] = torch.nn.utils.get_total_norm(grads).item()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = torch.utils.data.DataLoader([batch(i, n=1)[0] for i in range(48)], batch_size=4)
    trainer = L.Trainer(
        max_steps=6,
        accumulate_grad_batches=2,
        gradient_clip_val=1e-3,
        callbacks=[StabilityCallback(every=2, out=tmp_path / "normlab")],
        logger=CSVLogger(tmp_path, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        log_every_n_steps=1,
    )
    trainer.fit(Module(), data)
    records = [json.loads(line) for line in (tmp_path / "normlab/metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2, 4, 6]
    for r in records:
        parts = [v for k, v in r.items() if k.startswith("grad/norm/")]
        assert math.sqrt(sum(v * v for v in parts)) == pytest.approx(seen[r["step"]], rel=1e-5)
        assert "attn/logit_max/layer_0" in r and "update/ratio/layer_2" in r
    csv = next((tmp_path / "csv").rglob("metrics.csv")).read_text()
    assert "grad/norm/layer_0" in csv.splitlines()[0]
