"""normlab's fused CPU kernels (C++, compiled by torch.utils.cpp_extension on a fused class's first
use: model/fused_norms.py, model.ops_impl=fused; the reference classes, the default, never build
them), cached by torch under ~/.cache/torch_extensions or $TORCH_EXTENSIONS_DIR: the norms
(norms_cpu.cpp with their autograd, row loops in norms_kernel.h compiled per instruction set by
norms_isa_*.cpp; called from fused/norms.py) and the cross-entropy and SwiGLU
(cross_entropy_cpu.cpp, swiglu_cpu.cpp, fused/ops.py). All register ops under torch.ops.normlab. The
package knows nothing of the model: model/ calls it with tensors, and it sits below model/ in the
import order (it imports only torch).

A build is named by a hash of everything it depends on (build_name): the sources, the flags, the
compiler, torch and, for a -march=native build, the CPU. Checkouts of one commit share a build;
different sources never build over each other in the shared cache.

Where no compiler exists the build fails once, with a warning, and every fused path runs its
reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).parent
# the translation units compiled and linked into one library (they include the headers)
SOURCES = (
    "norms_cpu.cpp",
    "norms_isa_base.cpp",
    "norms_isa_avx2.cpp",
    "norms_isa_avx512.cpp",
    "cross_entropy_cpu.cpp",
    "swiglu_cpu.cpp",
)
_loaded: bool | None = None  # None: not tried yet
_built: dict = {}  # how the loaded build was made (for meta.json)
_announced = False  # whether this process printed the compile line


def cpu_features() -> str | None:
    """The CPU's instruction-set flags (Linux /proc/cpuinfo), or None where they cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):  # x86 / Arm
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return None


def build_target(features: str | None, portable: bool) -> list[str]:
    """The arch flags: -march=native where the CPU's flags can be read (build_name then keys the
    build by them: native code only runs on CPUs with the same instructions), none where they
    cannot, or NORMLAB_PORTABLE is set (the portable build has a copy of the norms' loops per
    instruction set and picks one at run time)."""
    return [] if portable or not features else ["-march=native"]


def source_files(folder: Path = HERE) -> dict[str, bytes]:
    """Every .cpp and .h under `folder` (fused/), by path relative to it: what a build compiles,
    byte for byte."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.suffix in (".cpp", ".h") and p.is_file()
    }


def compiler_identity() -> str:
    """The C++ compiler torch's build runs ($CXX, else c++) and the first line of its --version."""
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run(
            [*shlex.split(cxx), "--version"], capture_output=True, text=True, timeout=60
        ).stdout
        version = (out.strip().splitlines() or ["(no version)"])[0]
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        version = f"(not runnable: {type(e).__name__})"
    return f"{cxx}: {version}"


def torch_identity() -> str:
    """torch's version and where it and Python's headers are installed (the build's command lines
    name them: one environment's build is not rebuilt over by another's of the same version)."""
    return (
        f"torch {torch.__version__} at {Path(torch.__file__).parent}; python {sys.version_info[0]}."
        f"{sys.version_info[1]}{getattr(sys, 'abiflags', '')} at {sysconfig.get_paths()['include']}"
    )


def build_name(
    files: dict[str, bytes],
    cflags: list[str],
    ldflags: list[str],
    compiler: str,
    features: str | None,
    toolchain: str | None = None,
) -> str:
    """The extension's name: normlab_kernels_<native|portable>_<hash of everything the build depends
    on>, the sources' bytes (source_files), the translation units, the compile and link flags, the
    compiler (compiler_identity), torch (toolchain: torch_identity() unless given), the machine's
    architecture and, for a -march=native build, the CPU's flags (a node of a cluster with other
    instructions builds its own; a portable build runs on any, so it is shared). torch caches a
    build by name and rebuilds in place whatever differs: two checkouts that named their builds
    alike (by the CPU alone) rebuilt over each other on every load; now a build is reused exactly
    when it would come out the same."""
    native = "-march=native" in cflags
    key = {
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
        "sources": list(SOURCES),
        "cflags": list(cflags),
        "ldflags": list(ldflags),
        "compiler": compiler,
        "toolchain": torch_identity() if toolchain is None else toolchain,
        "machine": platform.machine(),
        "cpu": features if native else None,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"normlab_kernels_{'native' if native else 'portable'}_{digest}"


def kernel_available() -> bool:
    """Build (or load the cached build of) the CPU kernels once per process; False if that fails."""
    global _loaded
    if _loaded is None:
        features = cpu_features()
        arch = build_target(features, bool(os.environ.get("NORMLAB_PORTABLE")))
        cflags = ["-O3", "-fopenmp"] + arch  # -fopenmp: at::parallel_for is an inline OpenMP loop
        # one copy of the norms' loops, for this CPU; the portable build has one per instruction set
        if arch:
            cflags.append("-DNORMLAB_NATIVE")
        attempts = [(cflags, ["-fopenmp"])]
        # first with glibc's vector exp (libmvec), then without
        if sys.platform.startswith("linux"):
            attempts.insert(0, (cflags + ["-DNORMLAB_LIBMVEC"], ["-fopenmp", "-lmvec"]))
        # read once: what is hashed is what is built
        files, compiler = (source_files(), compiler_identity())
        for extra_cflags, extra_ldflags in attempts:
            name = build_name(files, extra_cflags, extra_ldflags, compiler, features)
            try:
                _build(name, files, extra_cflags, extra_ldflags)
                _loaded = True
                _built.update(
                    name=name, cflags=extra_cflags, norm_loops=torch.ops.normlab.norm_loops()
                )
                break
            except Exception as e:  # no compiler, no headers...: stay correct, just slower
                error = e
        else:
            warnings.warn(
                f"normlab: fused CPU kernels unavailable, using the reference paths ({error})",
                stacklevel=2,
            )
            _loaded = False
            _built.update(
                error=str(error).strip().splitlines()[0][:200] if str(error) else repr(error)
            )
    return _loaded


# torch.compile calls kernel_available while tracing; marked as a constant result there is no graph
# break at a first build. This is what torch.compiler.assume_constant_result(kernel_available) does,
# without its import of torch._dynamo (~40% of `import train`: a training run still pays it when
# torch.optim builds its first optimizer, but sampling, export and reading runs no longer do;
# tests/test_fast_norms.py checks that the decorator still sets exactly this attribute).
kernel_available._dynamo_marked_constant = True  # type: ignore[attr-defined]


def kernel_paths(device: str, norm_impl: str, ops_impl: str) -> dict:
    """Which implementation each op of a model runs on `device` ('cpu', 'cuda', ...), for meta.json:
    the fused path, or the reference and why (a fused path that falls back says so, not silently).
    Only a fused implementation builds (or loads) the kernels."""

    def fused(what: str) -> str:
        if device == "cpu":
            return (
                "fused CPU kernel"
                if kernel_available()
                else f"reference (kernel build failed: {_built['error']})"
            )
        if device == "cuda" and what == "norm":
            return "torch's fused F.rms_norm / F.layer_norm in float32"
        return f"reference (no fused {what} kernel on {device})"

    paths = {
        "norm": fused("norm") if norm_impl == "fused" else "reference",
        "cross_entropy": fused("cross_entropy") if ops_impl == "fused" else "reference",
        "swiglu": fused("swiglu") if ops_impl == "fused" else "reference",
    }
    if _loaded:
        paths["build"] = dict(_built)
    return paths


def fallen_back(paths: dict) -> list[str]:
    """'op: why' for each op of kernel_paths() whose fused path fell back to the reference."""
    return [
        f"{op}: {path}"
        for op, path in paths.items()
        if op != "build" and path.startswith("reference (")
    ]


def _build(
    name: str, files: dict[str, bytes], extra_cflags: list[str], extra_ldflags: list[str]
) -> None:
    """torch's load() of `files`, copied into the build directory first, under an OS file lock.

    The copy: torch's load() runs ninja, which rebuilds when a command line changes, and the command
    lines name the sources' paths. Compiled from the build directory's own copy (written once; the
    name is a hash of these bytes), a build is the same for every checkout that names it alike, and
    is not rebuilt for another's paths.

    The lock: load() holds torch's own build lock (a plain `lock` file in the build directory) while
    ninja checks or builds, in every process that loads; a process killed in that window (kill -9, a
    scheduler's preemption, a test's timeout) leaves the file behind, and every later process waits
    for it forever. An OS lock dies with its holder: holding it, no other normlab process is inside
    load(), so a `lock` file found then is stale and is removed."""
    from filelock import FileLock
    from torch.utils.cpp_extension import _get_build_directory, load

    build_dir = Path(_get_build_directory(name, False))
    build_dir.mkdir(parents=True, exist_ok=True)
    if not (build_dir / f"{name}.so").is_file():  # a cached build loads in under a second: no line
        announce_compile(build_dir)
    with FileLock(str(build_dir / "normlab.flock")):
        # torch's, left by a killed process (none is building now)
        (build_dir / "lock").unlink(missing_ok=True)
        src = build_dir / "src"
        _place(src, files)
        load(
            name=name,
            sources=[str(src / s) for s in SOURCES],
            extra_cflags=extra_cflags,
            extra_ldflags=extra_ldflags,
            extra_include_paths=[str(src)],
            is_python_module=False,
            build_directory=str(build_dir),
            verbose=False,
        )
    _register_fake()


def announce_compile(build_dir: Path) -> None:
    """The one line a compile prints (rank 0, once per process): what waits, how long, where."""
    global _announced
    if not _announced and os.environ.get("RANK", "0") == "0":  # once a job, not once a rank
        print(
            f"[normlab] compiling the fused CPU kernels (about a minute, once per machine and "
            f"source version; cached in {build_dir.parent})",
            file=sys.stderr,
            flush=True,
        )
    _announced = True


def _place(folder: Path, files: dict[str, bytes]) -> None:
    """Write `files` under `folder`, each only where it is missing or differs (an untouched file
    keeps its mtime: ninja does not recompile it), atomically (a process killed mid-write leaves no
    half file to compile)."""
    for rel, data in files.items():
        path = folder / rel
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def _register_fake() -> None:
    """Shape-only versions of the ops so torch.compile can trace through them."""

    @torch.library.register_fake("normlab::norm")
    def _(x, d, weight, bias, eps, center):
        dtype = torch.promote_types(x.dtype, weight.dtype) if weight is not None else x.dtype
        return x.new_empty(x.shape, dtype=dtype)

    @torch.library.register_fake("normlab::norm_fwd")
    def _(x, weight, bias, eps, center):
        dtype = torch.promote_types(x.dtype, weight.dtype) if weight is not None else x.dtype
        rows = x.new_empty(x.shape[0], dtype=torch.promote_types(x.dtype, torch.float32))
        return x.new_empty(x.shape, dtype=dtype), rows, rows.new_empty(x.shape[0])

    @torch.library.register_fake("normlab::norm_bwd")
    def _(grad, x, weight, rstd, mean, center, has_bias):
        dw = weight.new_empty(weight.shape) if weight is not None else None
        db = weight.new_empty(weight.shape) if weight is not None and has_bias else None
        return x.new_empty(x.shape), dw, db

    @torch.library.register_fake("normlab::cross_entropy_fwd")
    def _(logits, target, ignore_index):
        rows = logits.new_empty(
            logits.shape[0], dtype=torch.promote_types(logits.dtype, torch.float32)
        )
        return rows, rows.new_empty(logits.shape[0])

    @torch.library.register_fake("normlab::cross_entropy_bwd")
    def _(grad_scale, logits, target, lse, ignore_index):
        return logits.new_empty(logits.shape)

    @torch.library.register_fake("normlab::swiglu_fwd")
    def _(a, b):
        return a.new_empty(a.shape)

    @torch.library.register_fake("normlab::swiglu_bwd")
    def _(grad, a, b):
        return a.new_empty(a.shape), b.new_empty(b.shape)
