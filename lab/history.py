"""A study file's history against its results: every commit that changed lab/studies/<name>.yaml
after the first commit of any of its results (lab/results/<name>/, a pilot's included), with the
keys it changed, read from git where the checkout has its history; and the study file's own
`history:` notes (what git cannot show, e.g. a pilot kept elsewhere). A report states both: a file
changed after any of its results says so."""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _git(*args: str, repo: Path = REPO) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _follow(path: str, repo: Path) -> list[tuple[str, int, str, str, str, str]]:
    """[(commit, time, date, subject, the file's path at that commit, git's status of it)] newest
    first, across renames; a copy (another study's file copied to start this one) ends it."""
    out = _git(
        "log",
        "--follow",
        "--name-status",
        "--format=%x00%H%x09%ct%x09%ad%x09%s",
        "--date=short",
        "--",
        path,
        repo=repo,
    )
    rows = []
    for block in (out or "").split("\0")[1:]:
        head, *status = [x for x in block.splitlines() if x.strip()]
        commit, t, date, subject = head.split("\t", 3)
        fields = status[-1].split("\t") if status else [path]
        rows.append((commit, int(t), date, subject, fields[-1], fields[0]))
        if fields[0].startswith("C"):
            break
    return rows


def _load(commit: str, path: str, repo: Path) -> dict:
    text = _git("show", f"{commit}:{path}", repo=repo)
    try:
        data = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _changed(before: dict, after: dict) -> list[str]:
    """The top-level keys whose values differ (grid keys one level down: 'grid.model.dim')."""
    keys = []
    for k in sorted(set(before) | set(after)):
        a, b = before.get(k), after.get(k)
        if a == b:
            continue
        if k == "grid" and isinstance(a, dict) and isinstance(b, dict):
            keys += [f"grid.{g}" for g in sorted(set(a) | set(b)) if a.get(g) != b.get(g)]
        else:
            keys.append(k)
    return keys


def edits(name: str, repo: Path = REPO) -> list[str]:
    """One line per commit that changed the study file after its first committed result; [] without
    git."""
    head = _git("rev-parse", "HEAD", repo=repo)
    return [] if head is None else list(_edits(name, repo, head.strip()))


@lru_cache(maxsize=256)
def _edits(name: str, repo: Path, head: str) -> tuple[str, ...]:
    """edits() at commit `head`: read once per process (six `git log --follow` over the whole
    history, ~0.1 s each; a lab command or a test session asks for the same study many times)."""
    results = [
        r
        for f in ("report.md", "runs.json", "runs.json.gz", "report.json", "decision.md")
        for r in _follow(f"lab/results/{name}/{f}", repo)
    ]
    if not results:
        return ()
    first = min(results, key=lambda r: r[1])
    rows = _follow(f"lab/studies/{name}.yaml", repo)
    lines = []
    for i, (commit, t, date, subject, path, status) in enumerate(rows):
        if t <= first[1] or commit == first[0]:
            continue
        older = rows[i + 1] if i + 1 < len(rows) else None
        before = _load(older[0], older[4], repo) if older else {}
        changed = _changed(before, _load(commit, path, repo))
        if status.startswith("R") and not changed:  # moved (its comments' paths with it)
            continue
        what = ", ".join(changed) if changed else "nothing but its name or layout"
        lines.append(f"{commit[:7]} ({date}) changed {what}: {subject[:72]}")
    if lines:
        lines.insert(
            0,
            f"first results committed in {first[0][:7]} ({first[2]}); "
            "the study file changed since:",
        )
    return tuple(lines)


def history(name: str, notes: list | None, repo: Path = REPO) -> list[str]:
    """The report's history lines: the study file's notes, then what git shows (first results:
    commit, date)."""
    return [str(n) for n in notes or []] + edits(name, repo)
