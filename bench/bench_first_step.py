"""Time to the first step of `python train.py`: from launch to step 1's line in metrics.jsonl, per
arm.

    python -m bench.bench_first_step [--rounds 3] [--arm NAME=OVERRIDES ...] [--set key=value ...]

Arms (each its own train.py process; rounds alternate their order): `fresh` runs the default config
with an empty kernel cache (a new TORCH_EXTENSIONS_DIR), `fresh-fused` the fused classes
(model.norm_impl=fused model.ops_impl=fused) with an empty cache, `warm-fused` them with the cache
fresh-fused filled that round. --arm replaces them: NAME=key=value,key=value; a NAME starting with
`fresh` gets an empty cache, `warm-X` the one `fresh-X` filled (`warm`: `fresh`'s), any other the
one `fresh` filled. The data is prepared once before the first round (not timed). Prints each arm's
median and min..max in seconds and its ratio to the first arm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from training.config import number

REPO = Path(__file__).resolve().parent.parent
FUSED = ["model.norm_impl=fused", "model.ops_impl=fused"]
ARMS = {"fresh": [], "fresh-fused": FUSED, "warm-fused": FUSED}
BASE = [
    "train.steps=2",
    "train.eval_every=1000",
    "train.sample_tokens=0",
    "train.checkpoint_every=0",
]


def first_step(overrides: list[str], ext_dir: Path, out: Path, timeout: float = 900) -> float:
    """Seconds from launching train.py to step 1's record in its metrics.jsonl."""
    run = out / f"r{time.monotonic_ns()}"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir)}
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        *BASE,
        *overrides,
        f"log.out_dir={run.parent}",
        f"log.name={run.name}",
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    metrics = run / "metrics.jsonl"
    while time.perf_counter() - t0 < timeout:
        if metrics.is_file() and '"step": 1,' in metrics.read_text():
            elapsed = time.perf_counter() - t0
            proc.wait()
            return elapsed
        if proc.poll() is not None:
            raise SystemExit(f"train.py ended before its first step: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    proc.kill()
    raise SystemExit(f"no first step within {timeout:.0f} s")


def cache_of(arm: str) -> str:
    """Whose cache an arm reads: its own if fresh*, fresh-X's for warm-X, else fresh's."""
    if arm.startswith("fresh"):
        return arm
    return "fresh" + arm[len("warm") :] if arm.startswith("warm") else "fresh"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=number(int, ">= 1"), default=3)
    p.add_argument("--arm", action="append", default=[], metavar="NAME=k=v,k=v")
    p.add_argument(
        "--set", nargs="*", default=[], metavar="key=value", help="overrides for every arm"
    )
    a = p.parse_args(argv)
    arms = (
        {s.split("=", 1)[0]: [o for o in s.split("=", 1)[1].split(",") if o] for s in a.arm}
        if a.arm
        else ARMS
    )
    with tempfile.TemporaryDirectory(prefix="first-step-") as tmp:
        tmp = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; sys.argv = ['x', *sys.argv[1:]]; "
                "from training.config import load_config; from data.prepare import prepare; "
                "d = load_config(None, sys.argv[1:]).data; prepare(**vars(d))",
                *a.set,
            ],
            cwd=REPO,
            check=True,
        )
        times = {name: [] for name in arms}
        for r in range(a.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            # a warm arm reads what fresh filled
            order.sort(key=lambda name: not name.startswith("fresh"))
            for name in order:
                ext = tmp / f"ext-{r}-{cache_of(name)}"
                times[name].append(first_step(arms[name] + a.set, ext, tmp / "runs"))
                print(f"round {r + 1}: {name}: {times[name][-1]:.1f} s", flush=True)
    first = next(iter(arms))
    print(
        f"\n| arm | overrides | first step, s: median (min..max) | ratio to {first}: median "
        "(min..max) |"
    )
    print("|---|---|---|---|")
    for name, ts in times.items():
        ratios = [t / f for t, f in zip(ts, times[first], strict=True)]
        print(
            f"| {name} | {' '.join(arms[name]) or '(default)'} | {statistics.median(ts):.1f} "
            f"({min(ts):.1f}..{max(ts):.1f}) | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}..{max(ratios):.2f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
