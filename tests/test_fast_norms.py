"""The fused norm kernels against the reference formulas (and float64 truth), and what they save."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import rel_err

import fused.norms as fast_norms
from model.fused_norms import FusedLayerNorm, FusedRMSNorm
from model.norms import LayerNorm, RMSNorm

pytestmark = pytest.mark.slow  # the fused kernels: built on first use (~40 s fresh)

FastRMSNorm, FastLayerNorm = FusedRMSNorm, FusedLayerNorm
PAIRS = [(RMSNorm, FastRMSNorm), (LayerNorm, FastLayerNorm)]


_rel = rel_err


def _run(module, x, g):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(g)
    grads = [x.grad] + [p.grad for p in module.parameters()]
    return [y] + grads


def _pair(ref_cls, fast_cls, shape, dtype, bias=False, affine=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ref = ref_cls(shape, eps=1e-5, bias=bias, elementwise_affine=affine)
    if affine:
        ref.weight.data = torch.rand(ref.weight.shape, generator=gen) + 0.5
        if bias:
            ref.bias.data = torch.randn(ref.bias.shape, generator=gen)
    fast = fast_cls(shape, eps=1e-5, bias=bias, elementwise_affine=affine)
    fast.load_state_dict(ref.state_dict())
    return ref.to(dtype), fast.to(dtype)


def _as_accurate_as_the_reference(fast, ref, x, g):
    """The fused kernel's float32 outputs and gradients are as close to float64 math as torch's ops
    running the formula are (within 2x, or float32 noise: 2e-6 relative). A bound against the truth,
    not against the other float32 result: both round, and how they round depends on the CPU's vector
    width and FMA."""
    truth = _run(copy.deepcopy(ref).double(), x.double(), g.double())
    for f, r, t in zip(_run(fast, x, g), _run(ref, x, g), truth, strict=True):
        assert f.dtype == r.dtype and f.shape == r.shape
        assert _rel(f, t) < max(2 * _rel(r, t), 2e-6), (_rel(f, t), _rel(r, t))


def test_kernel_builds_here():
    # gcc is part of the supported setup; the fallback is tested below
    assert fast_norms.kernel_available()


CASES = [((4, 33, 768), 768), ((3, 7, 37), 37), ((2, 5, 6, 10), (6, 10)), ((1, 1, 13), 13)]


@pytest.mark.parametrize(
    "ref_cls,fast_cls,bias",
    [
        (RMSNorm, FastRMSNorm, False),
        (LayerNorm, FastLayerNorm, False),
        (LayerNorm, FastLayerNorm, True),
    ],
)
@pytest.mark.parametrize("xshape,shape", CASES)
def test_float32_matches_reference_within_rounding(ref_cls, fast_cls, bias, xshape, shape):
    ref, fast = _pair(ref_cls, fast_cls, shape, torch.float32, bias)
    gen = torch.Generator().manual_seed(1)
    x, g = torch.randn(xshape, generator=gen) * 3 + 1, torch.randn(xshape, generator=gen)
    _as_accurate_as_the_reference(fast, ref, x, g)


@pytest.mark.parametrize("ref_cls,fast_cls", PAIRS)
def test_large_inputs_take_the_streaming_store_path_and_still_match(ref_cls, fast_cls):
    # >= 32 MiB of float32 gradient: dx is written with non-temporal stores (norms_cpu.cpp,
    # kStreamBytes); an odd width exercises the unaligned head and tail of every row
    ref, fast = _pair(ref_cls, fast_cls, 1025, torch.float32)
    gen = torch.Generator().manual_seed(2)
    x, g = torch.randn(8195, 1025, generator=gen) * 3 + 1, torch.randn(8195, 1025, generator=gen)
    assert x.numel() * 4 >= 32 << 20
    _as_accurate_as_the_reference(fast, ref, x, g)


@pytest.mark.parametrize("ref_cls,fast_cls", PAIRS)
def test_non_contiguous_input_and_no_affine(ref_cls, fast_cls):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(40, 6, 9, generator=gen).transpose(0, 2)  # (9, 6, 40), non-contiguous
    g = torch.randn(9, 6, 40, generator=gen)
    assert not x.is_contiguous()
    for affine in (True, False):
        ref, fast = _pair(ref_cls, fast_cls, 40, torch.float32, affine=affine)
        _as_accurate_as_the_reference(fast, ref, x, g)


@pytest.mark.parametrize("ref_cls,fast_cls", PAIRS)
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_bfloat16_is_as_accurate_as_the_reference(ref_cls, fast_cls, weight_dtype):
    """bfloat16 input (with a bfloat16 gain, or a float32 gain as under autocast): outputs and
    gradients are as close to float64 math as the reference's are (both are limited by bfloat16
    rounding)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2048, 96, generator=gen) * 3 + 1
    g = torch.randn(2048, 96, generator=gen)
    ref, fast = _pair(ref_cls, fast_cls, 96, torch.float32)
    truth = _run(copy.deepcopy(ref).double(), x.double(), g.double())
    ref, fast = ref.to(weight_dtype), fast.to(weight_dtype)
    xb = x.bfloat16()
    gb = g.to(torch.promote_types(torch.bfloat16, weight_dtype))
    got_fast, got_ref = _run(fast, xb, gb), _run(ref, xb, gb)
    for f, r, t in zip(got_fast, got_ref, truth, strict=True):
        assert f.dtype == r.dtype
        assert _rel(f, t) < max(1.5 * _rel(r, t), 1e-6) and _rel(f, t) < 1e-2
    # same rounding points: outputs agree to bfloat16 ulps
    assert _rel(got_fast[0], got_ref[0]) < 4e-3


@pytest.mark.parametrize("ref_cls,fast_cls", PAIRS)
def test_float64_gradcheck(ref_cls, fast_cls):
    fast = fast_cls((3, 4), bias=ref_cls is LayerNorm).double()
    fast.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in fast.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in fast.parameters()]
    f = lambda x, *ps: torch.func.functional_call(fast, dict(zip(names, ps, strict=True)), (x,))
    assert torch.autograd.gradcheck(f, (x, *params))


def _saved_bytes(module, x):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x.detach().requires_grad_())
    return sum(saved)


@pytest.mark.parametrize("ref_cls,fast_cls", PAIRS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saves_fewer_bytes_for_backward(ref_cls, fast_cls, dtype):
    ref, fast = _pair(ref_cls, fast_cls, 256, dtype)
    x = torch.randn(64, 256).to(dtype)
    fast_bytes, ref_bytes = _saved_bytes(fast, x), _saved_bytes(ref, x)
    # the input, the gain and two per-row statistics, nothing of the size of x more
    assert (
        fast_bytes <= x.numel() * x.element_size() + 256 * fast.weight.element_size() + 2 * 64 * 4
    )
    assert fast_bytes < ref_bytes / 2


def test_falls_back_to_the_reference_without_a_kernel(monkeypatch):
    monkeypatch.setattr(fast_norms, "kernel_available", lambda: False)
    ref, fast = _pair(RMSNorm, FastRMSNorm, 16, torch.float32)
    x = torch.randn(3, 16)
    assert torch.equal(fast(x), ref(x))


@pytest.mark.parametrize("ref_cls,fast_cls", PAIRS)
@pytest.mark.parametrize("xshape,shape", [((4, 16), 8), ((4, 3, 8), (4, 8)), ((8,), (2, 4))])
def test_input_whose_last_dims_are_not_normalized_shape_is_refused(
    ref_cls, fast_cls, xshape, shape
):
    # before: the fast path reshaped (4, 16) into rows of 8 and returned a silently different tensor
    for cls in (ref_cls, fast_cls):
        with pytest.raises(ValueError, match="last dims must be"):
            cls(shape)(torch.randn(xshape))


def test_kernels_check_their_arguments():
    """A wrong-sized weight, bias, statistics or gradient is a RuntimeError, never an out-of-bounds
    read."""
    x, w = torch.randn(4, 8), torch.ones(8)
    ops = torch.ops.normlab
    y, rstd, mean = ops.norm_fwd(x, w, None, 1e-5, True)
    bad_calls = {
        "weight numel": lambda: ops.norm_fwd(x, torch.ones(3), None, 1e-5, False),
        "bias numel": lambda: ops.norm_fwd(x, w, torch.zeros(3), 1e-5, True),
        "bwd weight numel": lambda: ops.norm_bwd(
            torch.ones_like(x), x, torch.ones(3), rstd, mean, True, False
        ),
        "bwd grad shape": lambda: ops.norm_bwd(torch.ones(2, 8), x, w, rstd, mean, True, False),
        "bwd stats": lambda: ops.norm_bwd(
            torch.ones_like(x), x, w, rstd[:2], mean[:2], True, False
        ),
        "bwd x 1-d": lambda: ops.norm_bwd(torch.ones(8), x[0], w, rstd, mean, True, False),
        "ce bwd lse": lambda: ops.cross_entropy_bwd(
            torch.tensor(1.0), x, torch.zeros(4, dtype=torch.long), torch.zeros(2), -1
        ),
        "ce bwd target": lambda: ops.cross_entropy_bwd(
            torch.tensor(1.0), x, torch.full((4,), 99, dtype=torch.long), torch.zeros(4), -1
        ),
        "ce bwd scale": lambda: ops.cross_entropy_bwd(
            torch.ones(2), x, torch.zeros(4, dtype=torch.long), torch.zeros(4), -1
        ),
    }
    for what, call in bad_calls.items():
        with pytest.raises((RuntimeError, IndexError)):  # TORCH_CHECK / TORCH_CHECK_INDEX
            call()
            pytest.fail(f"{what}: accepted")


@pytest.mark.parametrize("ref_cls,fast_cls", PAIRS)
@pytest.mark.parametrize("xshape,shape", [((0, 8), 8), ((2, 0, 8), 8), ((3, 0), 0)])
def test_zero_size_inputs_behave_as_the_reference(ref_cls, fast_cls, xshape, shape):
    ref, fast = _pair(ref_cls, fast_cls, shape, torch.float32)
    x, g = torch.randn(xshape), torch.randn(xshape)
    for a, b in zip(_run(fast, x, g), _run(ref, x, g), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def test_the_loops_follow_torchs_instruction_set():
    """A native build runs its one -march=native copy of the loops; the portable one runs the copy
    for torch's own CPU capability (so ATEN_CPU_CAPABILITY=avx2 runs the AVX2 loops, as torch runs
    its AVX2 kernels)."""
    assert fast_norms.kernel_available()
    loops = torch.ops.normlab.norm_loops()
    if not os.environ.get("NORMLAB_PORTABLE"):
        assert loops.startswith("native")
    else:
        want = {"AVX512": "portable AVX-512", "AVX2": "portable AVX2"}
        assert loops == want.get(torch.backends.cpu.get_cpu_capability(), "portable baseline")


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_every_instruction_set_of_the_portable_build_is_as_accurate(capability):
    """The portable build's three copies of the loops (x86-64 baseline, AVX2, AVX-512), each run in
    a process that tells torch to use that instruction set: fp32 and bf16, RMSNorm and LayerNorm,
    against float64 math."""
    if capability != "default" and not _cpu_has(capability):
        pytest.skip(f"this CPU has no {capability}")
    code = (
        "import torch, fused\n"
        "assert fused.kernel_available()\n"
        "print(torch.ops.normlab.norm_loops())\n"
        "from model.fused_norms import FusedLayerNorm, FusedRMSNorm\n"
        "from model.norms import LayerNorm, RMSNorm\n"
        "g = torch.Generator().manual_seed(0)\n"
        "for ref, cls in ((RMSNorm, FusedRMSNorm), (LayerNorm, FusedLayerNorm)):\n"
        "  for dt in (torch.float32, torch.bfloat16):\n"
        "    x = torch.randn(37, 3, 77, generator=g) * 3 + 1; dy = torch.randn(37, 3, 77, "
        "generator=g)\n"
        "    m = cls(77); m.weight.data.uniform_(0.5, 1.5, generator=g)\n"
        "    t = ref(77).double(); t.load_state_dict(m.state_dict())\n"
        "    xd = x.double().requires_grad_(); t(xd).backward(dy.double())\n"
        "    m = m.to(dt); xf = x.to(dt).requires_grad_(); y = m(xf); y.backward(dy.to(dt))\n"
        "    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()\n"
        "    bound = 2e-6 if dt == torch.float32 else 1e-2\n"
        "    errs = (rel(y, t(x.double())), rel(xf.grad, xd.grad), rel(m.weight.grad, "
        "t.weight.grad))\n"
        "    assert max(errs) < bound, (cls, dt, errs)\n"
    )
    env = {**os.environ, "NORMLAB_PORTABLE": "1", "ATEN_CPU_CAPABILITY": capability}
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    want = {"default": "portable baseline", "avx2": "portable AVX2", "avx512": "portable AVX-512"}[
        capability
    ]
    assert r.stdout.strip() == want, r.stdout


def _cpu_has(capability: str) -> bool:
    from fused import cpu_features

    flags = (cpu_features() or "").split()
    return {
        "avx2": {"avx2", "fma", "bmi2"},
        "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    }[capability] <= set(flags)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [FusedRMSNorm, FusedLayerNorm])
def test_compiles_without_a_graph_break_and_matches_eager(cls):
    """torch.compile traces the fused norm (torch.ops.normlab.norm, its autograd in C++) with no
    graph break: AOTAutograd turns it into the norm_fwd / norm_bwd kernels, through their fake
    (shape-only) versions."""
    import torch._dynamo

    torch._dynamo.reset()
    norm = cls(24)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(5, 7, 24)

    def loss(x):
        return (norm(x) * torch.arange(24.0)).sum()

    explained = torch._dynamo.explain(loss)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert any("normlab.norm" in str(n.target) for n in explained.graphs[0].graph.nodes)
    grads = []
    for fn in (loss, torch.compile(loss, backend="aot_eager", fullgraph=True)):
        xx = x.clone().requires_grad_()
        norm.weight.grad = None
        fn(xx).backward()
        grads.append((xx.grad, norm.weight.grad))
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)  # the same kernels, traced


@pytest.mark.slow
def test_kernel_available_is_a_compile_constant_without_importing_dynamo():
    """`import fused` (so `import train`) no longer pays for torch._dynamo; kernel_available carries
    exactly the mark torch.compiler.assume_constant_result would give it (if torch changes that
    mark, this fails)."""
    import fused

    code = "import sys, fused, train; sys.exit('torch._dynamo' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent).returncode
        == 0
    )

    def probe():
        return True

    before = set(vars(probe))
    assert torch.compiler.assume_constant_result(probe) is probe
    marks = {k: v for k, v in vars(probe).items() if k not in before}
    assert marks and all(getattr(fused.kernel_available, k) == v for k, v in marks.items())
