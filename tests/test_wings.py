"""Two wings, one contract (docs/DESIGN.md): the trainer imports nothing of the lab, and the lab's
pipeline reaches the trainer only through train.py, the config loader and the run directory."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRAINER = ["train.py", "model", "training", "data", "fused"]
TRAINER_PACKAGES = {"train", "model", "training", "data", "fused"}
OUTSIDE = {"lab", "scripts", "bench", "tests", "conftest"}
# what the lab's pipeline may import of the trainer: train.py (main, prepare, describe), the config
# loader, the run directory's files and what their statuses mean, and the exit codes
CONTRACT = {"train", "training.config", "training.rundir", "training.monitor", "training.errors"}


def files(*roots: str) -> list[Path]:
    out = []
    for root in roots:
        path = REPO / root
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return out


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (a function's lazy import counts)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from training import monitor` imports the module training.monitor
            folder = REPO / node.module.replace(".", "/")
            subs = {a.name for a in node.names if (folder / f"{a.name}.py").is_file()}
            found |= {f"{node.module}.{s}" for s in subs} if subs else {node.module}
    return found


@pytest.mark.parametrize("path", files(*TRAINER), ids=lambda p: str(p.relative_to(REPO)))
def test_the_trainer_imports_nothing_of_the_lab(path):
    wrong = sorted(m for m in imports(path) if m.split(".")[0] in OUTSIDE)
    assert not wrong, f"{path.relative_to(REPO)} imports {wrong}"


@pytest.mark.parametrize("path", sorted((REPO / "lab").glob("*.py")), ids=lambda p: p.name)
def test_the_lab_reaches_the_trainer_only_through_its_contract(path):
    used = {m for m in imports(path) if m.split(".")[0] in TRAINER_PACKAGES}
    wrong = sorted(used - CONTRACT)
    assert not wrong, (
        f"lab/{path.name} imports {wrong} of the trainer (allowed: {sorted(CONTRACT)})"
    )


def test_the_import_scanner_sees_lazy_and_from_imports(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "def f():\n    from lab.read import Run\n    import model.norms\n"
        "from training import rundir\n"
    )
    assert {"lab.read", "model.norms", "training.rundir"} <= imports(f)


def module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_no_import_circle_anywhere():
    """The import graph of every module (train.py, training/, model/, data/, fused/, normlab/, lab/,
    scripts/, bench/) has no cycle, lazy and TYPE_CHECKING imports counted: a module imported by one
    of its own imports is a circle."""
    roots = ["train.py", "training", "model", "data", "fused", "normlab", "lab", "scripts", "bench"]
    paths = files(*roots)
    modules = {module_of(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for m in imports(path):
            while m and m not in modules:  # `from lab.read import Run` -> lab.read
                m = m.rpartition(".")[0]
            if m and m != name and not name.startswith(m + ".") and m + ".__init__" != name:
                deps.add(m)
        graph[name] = deps - {n for n in deps if modules[n].name == "__init__.py"}
    # Tarjan's strongly connected components: any with more than one module is a circle
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    import sys

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"
