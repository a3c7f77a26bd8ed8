"""The fused cross-entropy and SwiGLU kernels against float64 truth and the torch-op references, and
the model built with either implementation."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err

from fused import SOURCES, kernel_available
from model import Llama, ModelArgs
from model.ops import fused_cross_entropy, fused_swiglu, reference_cross_entropy, reference_swiglu

pytestmark = pytest.mark.slow  # the fused kernels: built on first use (~40 s fresh)

REPO = Path(__file__).resolve().parent.parent


def test_kernel_builds_here():
    assert kernel_available()  # gcc is part of the supported setup; the fallback is tested below


def _fused_copy(folder: Path) -> Path:
    """The fused package copied to folder/fused, as another checkout holds it."""
    return Path(
        shutil.copytree(
            REPO / "fused", folder / "fused", ignore=shutil.ignore_patterns("__pycache__")
        )
    )


BUILD = dict(
    cflags=["-O3", "-fopenmp", "-march=native"],
    ldflags=["-fopenmp"],
    compiler="c++: c++ (GCC) 12.2.0",
    features="avx avx2 fma sse4_2",
    toolchain="torch 2.13.0 at /env",
)


def test_a_kernel_build_is_named_by_everything_it_depends_on():
    """torch caches a build by name and rebuilds it in place when anything differs: the name is a
    hash of the sources' bytes, the flags, the compiler, torch and (native builds) the CPU, so one
    differing is another build."""
    from fused import build_name, source_files

    files = source_files()
    assert set(files) >= {
        "norms_cpu.cpp",
        "norms_api.h",
        "norms_kernel.h",
        "common.h",
        "swiglu_cpu.cpp",
    }
    base = build_name(files, **BUILD)
    assert (
        base.startswith("normlab_kernels_native_")
        and build_name(dict(files), **dict(BUILD)) == base
    )  # reused
    header = {
        **files,
        "norms_kernel.h": files["norms_kernel.h"] + b" ",
    }  # one byte more in a header
    others = [build_name(header, **BUILD)] + [
        build_name(files, **{**BUILD, key: value})
        for key, value in (
            ("cflags", ["-O2", "-fopenmp", "-march=native"]),
            ("ldflags", ["-fopenmp", "-lmvec"]),
            ("compiler", "c++: c++ (GCC) 13.1.0"),
            ("features", "avx avx2 avx512f fma sse4_2"),
            ("toolchain", "torch 2.14.0 at /env"),
        )
    ]
    assert len({base, *others}) == 1 + len(others), others
    # a portable build runs on any CPU of the architecture: one build whatever this CPU's flags
    portable = {**BUILD, "cflags": ["-O3", "-fopenmp"]}
    assert build_name(files, **portable).startswith("normlab_kernels_portable_")
    assert (
        build_name(files, **portable)
        == build_name(files, **{**portable, "features": "avx2"})
        == build_name(files, **{**portable, "features": None})
    )


def test_two_checkouts_of_the_same_sources_name_the_same_build(tmp_path):
    from fused import build_name, source_files

    a, b = _fused_copy(tmp_path / "a"), _fused_copy(tmp_path / "b")
    assert source_files(a) == source_files(b) == source_files()
    assert build_name(source_files(a), **BUILD) == build_name(source_files(b), **BUILD)
    (b / "swiglu_cpu.cpp").write_bytes((b / "swiglu_cpu.cpp").read_bytes() + b"// another commit\n")
    assert build_name(source_files(a), **BUILD) != build_name(source_files(b), **BUILD)


def test_the_compiler_is_named_by_cxx_and_its_version(monkeypatch):
    from fused import compiler_identity

    monkeypatch.delenv("CXX", raising=False)
    default = compiler_identity()
    assert default.startswith("c++: ") and len(default) > len("c++: ")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert (
        compiler_identity() == "no-such-compiler-here: (not runnable: FileNotFoundError)" != default
    )


def test_a_stale_build_lock_is_cleared_and_the_build_compiles_its_own_copy_of_the_sources(
    tmp_path, monkeypatch
):
    """In a build directory of this test's own (TORCH_EXTENSIONS_DIR, read by torch at each call):
    torch's `lock` left by a killed process is gone when load() runs (torch would wait on it
    forever), and load() compiles the build directory's copy of the sources, written once (unchanged
    files keep their mtime: ninja recompiles nothing for another checkout's paths)."""
    import torch.utils.cpp_extension as cpp
    from torch.utils.file_baton import FileBaton

    import fused

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    name = "normlab_kernels_test"
    build = Path(cpp._get_build_directory(name, False))
    # torch made it; never in the user's cache
    assert build.parent == tmp_path / "ext" and build.is_dir()
    (build / "lock").touch()
    seen = []

    def load(name, sources, extra_include_paths, build_directory, **kw):
        baton = FileBaton(os.path.join(build_directory, "lock"))
        seen.append((baton.try_acquire(), sources, extra_include_paths))
        baton.release()

    monkeypatch.setattr(cpp, "load", load)
    monkeypatch.setattr(fused, "_register_fake", lambda: None)
    files = fused.source_files()
    fused._build(name, files, ["-O3"], [])
    src = build / "src"
    assert seen == [(True, [str(src / s) for s in fused.SOURCES], [str(src)])]
    assert {p.name: p.read_bytes() for p in src.iterdir()} == files
    written = {p: p.stat().st_mtime_ns for p in src.iterdir()}
    (build / "lock").touch()
    fused._build(name, files, ["-O3"], [])
    assert seen[1][0] and {p: p.stat().st_mtime_ns for p in src.iterdir()} == written


def test_the_compile_line_prints_only_when_a_build_is_compiled(tmp_path, monkeypatch, capsys):
    """The kernel line ("compiling ..., about a minute") is printed when the build's library is not
    in the cache (torch compiles then), and not when it is (a load in well under a second)."""
    import torch.utils.cpp_extension as cpp

    import fused

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(fused, "_register_fake", lambda: None)
    name = "normlab_kernels_test"

    def load(name, build_directory, **kw):  # what a compile leaves: the library
        Path(build_directory, f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(cpp, "load", load)
    for compiles in (True, False):
        monkeypatch.setattr(fused, "_announced", False)
        fused._build(name, fused.source_files(), ["-O3"], [])
        err = capsys.readouterr().err
        assert ("[normlab] compiling the fused CPU kernels" in err) is compiles, err
        assert compiles is False or str(tmp_path / "ext") in err  # where it is cached


@pytest.mark.slow
def test_a_default_run_builds_no_kernels(tmp_path, data_args):
    """train.py without model.norm_impl / ops_impl runs the reference classes: an empty kernel cache
    stays empty, no kernel line is printed, and meta.json says the reference ran."""
    ext = tmp_path / "ext"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext)}
    cmd = [
        sys.executable,
        "train.py",
        "--config",
        "configs/train/tiny.yaml",
        f"log.out_dir={tmp_path}",
        *data_args,
        "train.steps=2",
        "train.eval_every=2",
        "train.sample_tokens=0",
        "--name",
        "d",
    ]
    r = subprocess.run(
        cmd,
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[normlab]" not in r.stderr and not (ext.exists() and any(ext.iterdir()))
    kernels = json.loads((tmp_path / "d" / "meta.json").read_text())["kernels"]
    assert {kernels[k] for k in ("norm", "cross_entropy", "swiglu")} == {
        "reference"
    } and "build" not in kernels


@pytest.mark.slow
def test_checkouts_of_one_commit_share_a_build_and_a_stale_lock_does_not_hang_it(tmp_path):
    """Two copies of the package in other folders (a clone beside a working copy), in the suite's
    own TORCH_EXTENSIONS_DIR (the build every other test loads: a fresh directory would only add a
    minute's compile): the first copy builds, or loads that build; the second, finding torch's
    `lock` left by a killed process, loads the same build without waiting for the lock and without
    recompiling or relinking anything."""
    from torch.utils.cpp_extension import _get_build_directory

    def load(copy: Path) -> str:
        code = (
            "import fused; assert fused.kernel_available(); "
            f"assert fused.__file__.startswith({str(copy)!r}), fused.__file__; "
            "print(fused.kernel_paths('cpu', 'fused', 'fused')['build']['name'])"
        )
        env = {**os.environ, "PYTHONPATH": str(copy.parent)}
        r = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip()

    a, b = _fused_copy(tmp_path / "a"), _fused_copy(tmp_path / "b")
    name = load(a)
    build = Path(_get_build_directory(name, False))
    outputs = [*build.glob("*.o"), build / f"{name}.so"]
    built = {p: p.stat().st_mtime_ns for p in outputs}
    (build / "lock").touch()
    assert load(b) == name
    assert not (build / "lock").exists()
    assert len(built) == len(SOURCES) + 1 and {p: p.stat().st_mtime_ns for p in outputs} == built


def test_kernel_builds_are_native_where_the_cpu_is_known():
    """-march=native where the CPU's flags can be read (build_name keys such a build by them: a node
    with other instructions never loads it from a shared home), portable where they cannot or
    NORMLAB_PORTABLE is set."""
    from fused import build_target, cpu_features

    assert build_target("avx avx2 fma sse4_2", portable=False) == ["-march=native"]
    assert build_target(None, portable=False) == build_target("avx2", portable=True) == []
    assert cpu_features() is None or len(cpu_features()) > 0


def test_fallbacks_are_named():
    from fused import kernel_paths

    cuda = kernel_paths("cuda", "fused", "fused")
    assert cuda["cross_entropy"].startswith("reference (no fused") and cuda["swiglu"].startswith(
        "reference ("
    )
    assert kernel_paths("cpu", "fused", "reference")["cross_entropy"] == "reference"
    assert kernel_paths("cpu", "fused", "fused")["norm"] == "fused CPU kernel"


def _logits(rows, vocab, dtype, seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)
    t = torch.randint(0, vocab, (rows,), generator=gen)
    t[::5] = -1  # some ignored rows
    return x, t


def _loss_and_grad(fn, x, t):
    x = x.detach().clone().requires_grad_()
    value = fn(x, t, ignore_index=-1)
    value.backward()
    return value, x.grad


_rel = rel_err


@pytest.mark.parametrize("rows,vocab", [(1, 1), (3, 7), (37, 33), (64, 4099), (300, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_float64_as_closely_as_the_reference(rows, vocab, dtype):
    x, t = _logits(rows, vocab, dtype)
    if (t == -1).all():
        t[0] = 0
    truth, truth_grad = _loss_and_grad(F.cross_entropy, x.double(), t)
    fast, fast_grad = _loss_and_grad(fused_cross_entropy, x, t)
    ref, ref_grad = _loss_and_grad(reference_cross_entropy, x, t)
    assert fast.dtype == ref.dtype == torch.float32 and fast_grad.dtype == ref_grad.dtype == dtype
    assert abs(fast.item() - truth.item()) <= 1e-6 * max(1.0, abs(truth.item()))
    # the gradient is rounded once to the logits' dtype: as close to float64 as the reference's
    eps = torch.finfo(dtype).eps
    assert _rel(fast_grad, truth_grad) <= max(2 * _rel(ref_grad, truth_grad), 4 * eps)
    # element by element: one rounding step of the dtype apart (float32: a few ulp of exp)
    torch.testing.assert_close(
        fast_grad.float(),
        ref_grad.float(),
        rtol=max(2 * eps, 1e-5),
        atol=2 * eps * ref_grad.abs().max().item(),
    )


def test_float64_gradcheck():
    x, t = _logits(6, 11, torch.float64)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fused_cross_entropy(x, t, ignore_index=-1), (x,))
    assert fused_cross_entropy(x, t).dtype == torch.float64


def test_non_contiguous_logits_and_large_values():
    x, t = _logits(40, 64, torch.float32, scale=200.0)  # logits in the hundreds: no overflow in exp
    x_t = x.t().contiguous().t()  # the same values, column-major
    assert not x_t.is_contiguous()
    torch.testing.assert_close(
        fused_cross_entropy(x_t, t), F.cross_entropy(x.double(), t, ignore_index=-1).float()
    )


def test_nan_and_edge_cases_behave_like_torch():
    x, t = _logits(8, 16, torch.float32)
    x[3, 5] = float("nan")
    # a NaN logit is a NaN loss: divergence detection relies on it
    assert fused_cross_entropy(x, t).isnan()
    all_ignored = torch.full((8,), -1)
    assert (
        fused_cross_entropy(x, all_ignored).isnan()
        and F.cross_entropy(x, all_ignored, ignore_index=-1).isnan()
    )
    bad = t.clone()
    bad[0] = 16
    with pytest.raises(IndexError, match="out of bounds"):
        fused_cross_entropy(x, bad)


def _saved_bytes(fn, x, t):
    saved = []

    def pack(s):
        saved.append(s.numel() * s.element_size())
        return s

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda s: s):
        fn(x.detach().requires_grad_(), t)
    return sum(saved)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saves_only_the_logits_and_per_row_values(dtype):
    x, t = _logits(64, 1000, dtype)
    fast, ref = _saved_bytes(fused_cross_entropy, x, t), _saved_bytes(reference_cross_entropy, x, t)
    # logits, targets, logsumexp, count
    assert fast <= x.numel() * x.element_size() + 64 * (8 + 4) + 8
    assert fast < ref


def test_falls_back_to_the_reference_without_a_kernel(monkeypatch):
    import fused.ops

    monkeypatch.setattr(fused.ops, "kernel_available", lambda: False)
    x, t = _logits(5, 9, torch.float32)
    assert torch.equal(fused_cross_entropy(x, t), reference_cross_entropy(x, t))


def _swiglu_grads(fn, a, b, g):
    a, b = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    h = fn(a, b)
    h.backward(g.to(h.dtype))
    return h, a.grad, b.grad


@pytest.mark.parametrize("shape", [(1,), (3, 7), (4, 129, 33), (2, 8192 * 3 + 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_swiglu_matches_float64_at_least_as_closely_as_the_reference(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    a, b, g = (torch.randn(shape, generator=gen) * 4 for _ in range(3))  # silu's both tails
    a, b = a.to(dtype), b.to(dtype)
    truth = _swiglu_grads(reference_swiglu, a.double(), b.double(), g.double())
    fast = _swiglu_grads(fused_swiglu, a, b, g)
    ref = _swiglu_grads(reference_swiglu, a, b, g)
    eps = torch.finfo(dtype).eps
    for f, r, t in zip(fast, ref, truth, strict=True):  # output, da, db
        assert f.dtype == dtype and f.shape == t.shape
        assert _rel(f, t) <= max(1.01 * _rel(r, t), 4 * eps)


def test_swiglu_float64_gradcheck_and_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(0)
    a, b = (
        torch.randn(5, 6, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    assert torch.autograd.gradcheck(fused_swiglu, (a, b))
    both = torch.randn(4, 10, generator=gen)
    x, y = both[:, :5], both[:, 5:]  # halves of one projection: strided views
    torch.testing.assert_close(fused_swiglu(x, y), reference_swiglu(x, y))


def test_swiglu_saves_two_tensors_not_three():
    a, b = torch.randn(64, 100), torch.randn(64, 100)
    saved = {}
    for name, fn in (("fused", fused_swiglu), ("reference", reference_swiglu)):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda s, sizes=sizes: sizes.append(s.numel()) or s, lambda s: s
        ):
            fn(a.clone().requires_grad_(), b.clone().requires_grad_())
        saved[name] = sum(sizes)
    assert saved["fused"] == 2 * a.numel() < saved["reference"]


def test_model_loss_is_the_same_with_either_implementation():
    args = ModelArgs(dim=32, n_layers=2, n_heads=4, vocab_size=97, max_seq_len=16)
    grads, losses = [], []
    for impl in ("reference", "fused"):
        torch.manual_seed(0)
        model = Llama(ModelArgs(**{**vars(args), "ops_impl": impl}))
        idx = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(1))
        targets = idx.roll(-1, 1)
        targets[:, -1] = -1
        _, value = model(idx, targets)
        value.backward()
        losses.append(value)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_unknown_ops_impl_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown ops_impl 'fast'; valid: fused, reference"):
        Llama(ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=16, ops_impl="fast"))


def test_kernel_build_retries_without_libmvec_then_falls_back(monkeypatch):
    import fused as kernels

    calls = []

    def build(name, files, cflags, ldflags):
        calls.append("-lmvec" in ldflags)
        if "-lmvec" in ldflags or fail_all:
            raise OSError("cannot find -lmvec")

    monkeypatch.setattr(kernels, "_build", build)
    monkeypatch.setattr(kernels.sys, "platform", "linux")
    fail_all = False
    monkeypatch.setattr(kernels, "_loaded", None)
    assert kernels.kernel_available() and calls == [True, False]
    fail_all = True
    monkeypatch.setattr(kernels, "_loaded", None)
    with pytest.warns(UserWarning, match="reference paths"):
        assert not kernels.kernel_available()
