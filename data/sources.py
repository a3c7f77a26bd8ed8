"""Where text comes from, named by one string: `pydocs`, `pystdlib`, `text:PATH_OR_GLOB` or
`hf:NAME[:CONFIG][@SPLIT][#REVISION]`.

The two embedded corpora ship with every Python, so they need no network, and both are the Python
Software Foundation's, under the PSF License Agreement: `pydocs` is the standard library's
documentation (its docstrings and pydoc topics: English prose about code), `pystdlib` its source
code (code, comments and docstrings: another kind of text), one document per file, deduplicated, so
that the train / val split (by document) never puts a file in both."""

from __future__ import annotations

import ast
import glob
import hashlib
import os
import platform
import sys
import sysconfig

KINDS = ("pydocs", "pystdlib", "text:PATH_OR_GLOB", "hf:NAME[:CONFIG][@SPLIT][#REVISION]")
EMBEDDED = ("pydocs", "pystdlib")

# Standard-library parts that are tests, demos, vendored code or side-effect toys rather than
# documentation.
_SKIP = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "pydoc_data",
    "this",
    "antigravity",
    "site-packages",
    "__pycache__",
    "__phello__",
}


class DataError(ValueError):
    """Bad data input: the message is the one line the user sees."""


def parse_source(spec: str) -> tuple[str, str]:
    """('pydocs' | 'pystdlib' | 'text' | 'hf', argument) for a source string, or DataError listing
    the valid forms."""
    kind, _, arg = spec.partition(":")
    if spec in EMBEDDED or (kind in ("text", "hf") and arg):
        return kind, arg
    raise DataError(f"unknown data source {spec!r}; valid: {', '.join(KINDS)}")


def source_key(spec: str, text_field: str = "text") -> dict:
    """A cheap identity of the source for the prepare cache (computed without reading the
    corpus)."""
    kind, arg = parse_source(spec)
    if kind in EMBEDDED:
        return {
            "source": spec,
            "python": sys.version,
            "implementation": platform.python_implementation(),
        }
    if kind == "text":
        files = _text_files(arg)
        return {
            "source": spec,
            "files": [(f, os.path.getsize(f), os.path.getmtime(f)) for f in files],
        }
    return {"source": spec, "text_field": text_field}


VERSION = platform.python_version()


def describe(spec: str) -> str:
    kind, arg = parse_source(spec)
    if kind == "pydocs":
        return f"docstrings and pydoc topics of the Python {VERSION} standard library"
    if kind == "pystdlib":
        return f"source code of the Python {VERSION} standard library, one document per file"
    return {"text": f"local text files {arg}", "hf": f"Hugging Face dataset {arg}"}[kind]


def load_documents(spec: str, text_field: str = "text", max_bytes: int = 0):
    """The source's documents as a datasets.Dataset with one column, 'text'. `max_bytes` (> 0) caps
    a hub source: it is streamed and read only until its documents hold that many bytes."""
    import datasets

    kind, arg = parse_source(spec)
    if kind == "pydocs":
        return datasets.Dataset.from_dict({"text": pydocs_documents()})
    if kind == "pystdlib":
        return datasets.Dataset.from_dict({"text": pystdlib_documents()})
    if kind == "text":
        return _load_text(arg)
    return _load_hf(arg, text_field, max_bytes)


def _load_text(pattern: str):
    """Local text files; a "document" is a paragraph (blank-line separated), so even one file splits
    into train / val. Files that are not UTF-8 text are named in one line."""
    import datasets

    files = _text_files(pattern)
    for f in files:  # the text loader reads them anyway; reading first names the bad file
        try:
            with open(f, encoding="utf-8") as fh:
                while fh.read(1 << 24):
                    pass
        except UnicodeDecodeError as e:
            raise DataError(
                f"text source file {f!r} is not UTF-8 text (byte {e.start}: {e.reason}); give "
                "plain "
                f"text files"
            ) from None
        except OSError as e:
            raise DataError(f"cannot read text source file {f!r}: {e.strerror or e}") from None
    if all(os.path.getsize(f) == 0 for f in files):
        return datasets.Dataset.from_dict({"text": []})
    return datasets.load_dataset("text", data_files=files, sample_by="paragraph", split="train")


def _text_files(pattern: str) -> list[str]:
    files = sorted(
        f for f in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(f)
    )
    if not files:
        raise DataError(
            f"text source {pattern!r} matches no files; give a path or glob of plain-text files"
        )
    return files


def parse_hf(arg: str) -> tuple[str, str | None, str, str | None]:
    """'NAME[:CONFIG][@SPLIT][#REVISION]' -> (name, config, split, revision). NAME may be a local
    folder of a dataset saved in the hub's layout (data files), which loads offline."""
    arg, _, revision = arg.partition("#")
    name, _, split = arg.partition("@")
    name, _, config = name.partition(":")
    return name, config or None, split or "train", revision or None


def _load_hf(arg: str, text_field: str, max_bytes: int = 0):
    import datasets

    name, config, split, revision = parse_hf(arg)
    # the failure below is reported in one line of ours
    datasets.utils.logging.set_verbosity_error()
    import huggingface_hub

    huggingface_hub.utils.logging.set_verbosity_error()
    try:
        ds = datasets.load_dataset(
            name, config, split=split, revision=revision, streaming=bool(max_bytes)
        )
        columns = ds.column_names if not max_bytes else list(next(iter(ds)).keys())
    # offline, unknown name, bad split or revision...: one line, not a stack trace
    except Exception as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise DataError(
            f"could not load Hugging Face dataset {arg!r} ({reason}); without network use "
            f"data.source=pydocs, pystdlib or text:PATH"
        ) from None
    if text_field not in columns:
        raise DataError(
            f"dataset {arg!r} has no text field {text_field!r}; columns: {', '.join(columns)}"
            f" (set data.text_field)"
        )
    if max_bytes:  # streamed: read documents in order until they hold max_bytes
        texts, total = [], 0
        for row in ds:
            text = row[text_field] or ""
            texts.append(text)
            total += len(text.encode("utf-8"))
            if total >= max_bytes:
                break
        return datasets.Dataset.from_dict({"text": texts})
    return (
        ds.select_columns([text_field]).rename_column(text_field, "text")
        if text_field != "text"
        else ds
    )


def pydocs_documents() -> list[str]:
    """The documentation inside this Python installation, deterministically: one document per pydoc
    topic and one per standard-library module (its docstrings and those of its public classes and
    functions).

    Modules are parsed with `ast`, never imported, so collecting them has no side effects.
    """
    from pydoc_data.topics import topics

    docs = [f"{name}\n\n{text.strip()}" for name, text in sorted(topics.items())]
    for path, rel in stdlib_files():
        doc = _file_docs(path, rel)
        if doc:
            docs.append(doc)
    return docs


def stdlib_files() -> list[tuple[str, str]]:
    """(path, path relative to the standard library) of every module file pydocs and pystdlib read,
    in order."""
    stdlib = sysconfig.get_paths()["stdlib"]
    return [
        (path, os.path.relpath(path, stdlib))
        for name in sorted(sys.stdlib_module_names)
        if name not in _SKIP and not name.startswith("_")
        for path in _module_files(stdlib, name)
    ]


def pystdlib_documents() -> list[str]:
    """The standard library's source code, one document per module file, deduplicated by content
    (identical files would otherwise land in both splits), in path order."""
    docs, seen = [], set()
    for path, _ in stdlib_files():
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if text.strip() and digest not in seen:
            seen.add(digest)
            docs.append(text)
    return docs


def _module_files(stdlib: str, name: str) -> list[str]:
    if os.path.isfile(single := os.path.join(stdlib, name + ".py")):
        return [single]
    files = []
    for folder, dirs, names in os.walk(os.path.join(stdlib, name)):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP and not d.startswith("test"))
        files += [
            os.path.join(folder, f)
            for f in sorted(names)
            if f.endswith(".py") and not f.startswith("test")
        ]
    return files


def _file_docs(path: str, rel: str) -> str:
    """'module.name' followed by the docstrings of the module and its public classes / functions."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, OSError):
        return ""
    module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
    parts = [d for d in [ast.get_docstring(tree)] if d]
    for node in ast.walk(tree):
        if isinstance(
            node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        ) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc:
                parts.append(f"{node.name}:\n{doc}")
    return f"{module}\n\n" + "\n\n".join(parts) if parts else ""


def corpus_sha256(texts) -> str:
    """sha256 of the documents in order, each followed by a NUL separator."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()
