"""A study that outlives its machine: pack its finished runs into files that can be committed or
copied (a machine that is wiped, a spot instance), unpack them on the next one and rerun the same
sweep, which passes over them (every run is finished or not by its summary.json alone) and makes
the same protocol choices from them.

    python -m lab.pack studies/centring-width lab/pending  # -> lab/pending/centring-width/part-001
    python -m lab.pack --unpack lab/pending/centring-width --out studies

Each pack is a new part holding the runs that finished since the last one (its files but the
checkpoints: a finished run is never resumed) and the study folder's own files as they are now
(study.yaml, design.json, sweep.json); parts are never rewritten, so each run is stored once.
Unpacking reads the parts in order into a study folder that does not exist yet."""

from __future__ import annotations

import io
import os
import sys
import tarfile
import tempfile
from pathlib import Path

from training import errors
from training.monitor import FINISHED
from training.rundir import RunDir, write_bytes

RUN_FILES = ("config.yaml", "meta.json", "metrics.jsonl", "summary.json")


def parts(folder: Path) -> list[Path]:
    """A study's packs in the order they were written."""
    return sorted(Path(folder).glob("part-*.tar.xz"))


def _packed_runs(folder: Path) -> set[str]:
    """The run names earlier parts hold."""
    names = set()
    for part in parts(folder):
        with tarfile.open(part) as tar:
            names |= {Path(m).parts[2] for m in tar.getnames() if len(Path(m).parts) > 3}
    return names


def pack(study_dir: Path, dest: Path) -> tuple[Path | None, int]:
    """Write dest/<study>/part-NNN.tar.xz with the runs finished since the last part: (the part or
    None when there is nothing new, the number of runs it holds)."""
    study_dir = Path(study_dir)
    if not (study_dir / "sweep.json").is_file():
        raise errors.BadInput(
            f"{study_dir} is not a study folder (no sweep.json): pack the "
            "folder a sweep wrote, <out>/<study name>"
        )
    folder = Path(dest) / study_dir.name
    done = _packed_runs(folder)
    runs = sorted(
        p
        for p in (study_dir / "runs").glob("*")
        if p.name not in done and RunDir(p).status() in FINISHED
    )
    if not runs:
        return None, 0
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{len(parts(folder)) + 1:03d}.tar.xz"
    buffer = io.BytesIO()  # a few MB: written whole by the atomic rule
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=9) as tar:
        for f in sorted(p for p in study_dir.iterdir() if p.is_file()):
            tar.add(f, arcname=f"{study_dir.name}/{f.name}")
        for run in runs:
            for name in RUN_FILES:
                if (run / name).is_file():
                    tar.add(run / name, arcname=f"{study_dir.name}/runs/{run.name}/{name}")
    write_bytes(path, buffer.getvalue())
    return path, len(runs)


def _check(part: Path, name: str) -> None:
    """A part holds only files and folders under name/ (nothing absolute, no .., no links), and
    reads whole (a truncated or damaged part is refused before anything is unpacked)."""
    try:
        with tarfile.open(part) as tar:
            members = tar.getmembers()
            for m in members:
                if m.isfile():
                    tar.extractfile(m).read()  # every byte: a part cut short fails here
    except (tarfile.TarError, EOFError, OSError) as e:
        if errors.storage_fault(e) is not None:
            raise
        raise errors.BadInput(
            f"{part} is damaged ({e}): copy it again from where it was packed"
        ) from None
    for m in members:
        where = Path(m.name).parts
        if where[0] != name or ".." in where or not (m.isfile() or m.isdir()):
            raise errors.BadInput(
                f"{part} holds {m.name}: a part holds only files and folders under {name}/"
            )


def unpack(folder: Path, out: Path) -> tuple[Path, int]:
    """Read every part of `folder` in order into out/<study>, a folder that appears whole or not at
    all: (the study folder, its runs)."""
    folder = Path(folder)
    found = parts(folder)
    if not found:
        raise errors.BadInput(f"{folder} holds no part-*.tar.xz: give the folder pack wrote")
    study_dir = Path(out) / folder.name
    if study_dir.exists():
        raise errors.BadInput(
            f"{study_dir} exists: unpack into a study folder that does not "
            "exist yet (its runs would mix with the packed ones)"
        )
    for part in found:
        _check(part, folder.name)
    # the data filter (Python >= 3.10.12) refuses what _check refused, a second time
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    Path(out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{folder.name}.") as tmp:
        for part in found:
            with tarfile.open(part) as tar:
                tar.extractall(tmp, **safe)
        os.replace(Path(tmp) / folder.name, study_dir)
    return study_dir, len(list((study_dir / "runs").glob("*")))


def main(argv: list[str] | None = None) -> int:
    """The command: its errors end in one line and their code (training/errors.py)."""
    return errors.run(_main, argv)


def _main(argv: list[str] | None) -> int:
    p = errors.Parser(prog="python -m lab.pack", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a study folder to pack, or with --unpack the folder of parts")
    p.add_argument("dest", nargs="?", help="where parts go: <dest>/<study>/part-NNN.tar.xz")
    p.add_argument("--unpack", action="store_true", help="restore a packed study (see --out)")
    p.add_argument("--out", default="studies", help="with --unpack: where studies go")
    a = p.parse_args(argv)
    if not a.unpack and a.dest is None:
        p.error("give where the parts go (DEST), e.g. lab/pending")
    if a.unpack:  # a full disk: no half part, no half-unpacked study (both are whole)
        study_dir, n = unpack(Path(a.source), Path(a.out))
        print(f"{study_dir}: {n} finished runs; rerun its sweep (--out {a.out}) to go on")
        return 0
    path, n = pack(Path(a.source), Path(a.dest))
    print(f"{path}: {n} runs" if path else f"{a.source}: no run finished since the last part")
    return 0


if __name__ == "__main__":
    sys.exit(main())
