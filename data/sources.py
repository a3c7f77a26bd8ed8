"""Where text comes from, named by one string: `pydocs`, `text:PATH_OR_GLOB` or `hf:NAME[:CONFIG][@SPLIT]`."""

from __future__ import annotations

import ast
import glob
import hashlib
import os
import platform
import sys
import sysconfig

KINDS = ("pydocs", "text:PATH_OR_GLOB", "hf:NAME[:CONFIG][@SPLIT]")

# Standard-library parts that are tests, demos, vendored code or side-effect toys rather than documentation.
_SKIP = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "pydoc_data", "this", "antigravity",
         "site-packages", "__pycache__", "__phello__"}


class DataError(ValueError):
    """Bad data input: the message is the one line the user sees."""


def parse_source(spec: str) -> tuple[str, str]:
    """('pydocs' | 'text' | 'hf', argument) for a source string, or DataError listing the valid forms."""
    kind, _, arg = spec.partition(":")
    if spec == "pydocs" or (kind in ("text", "hf") and arg):
        return kind, arg
    raise DataError(f"unknown data source {spec!r}; valid: {', '.join(KINDS)}")


def source_key(spec: str, text_field: str = "text") -> dict:
    """A cheap identity of the source for the prepare cache (computed without reading the corpus)."""
    kind, arg = parse_source(spec)
    if kind == "pydocs":
        return {"source": spec, "python": sys.version, "implementation": platform.python_implementation()}
    if kind == "text":
        files = _text_files(arg)
        return {"source": spec, "files": [(f, os.path.getsize(f), os.path.getmtime(f)) for f in files]}
    return {"source": spec, "text_field": text_field}


def describe(spec: str) -> str:
    kind, arg = parse_source(spec)
    if kind == "pydocs":
        return f"docstrings and pydoc topics of the Python {platform.python_version()} standard library"
    return {"text": f"local text files {arg}", "hf": f"Hugging Face dataset {arg}"}[kind]


def load_documents(spec: str, text_field: str = "text"):
    """The source's documents as a datasets.Dataset with one column, 'text'."""
    import datasets

    kind, arg = parse_source(spec)
    if kind == "pydocs":
        return datasets.Dataset.from_dict({"text": pydocs_documents()})
    if kind == "text":
        return _load_text(arg)
    return _load_hf(arg, text_field)


def _load_text(pattern: str):
    """Local text files; a "document" is a paragraph (blank-line separated), so even one file splits into
    train / val. Files that are not UTF-8 text are named in one line."""
    import datasets

    files = _text_files(pattern)
    for f in files:  # the text loader reads them anyway; reading first names the bad file
        try:
            with open(f, encoding="utf-8") as fh:
                while fh.read(1 << 24):
                    pass
        except UnicodeDecodeError as e:
            raise DataError(f"text source file {f!r} is not UTF-8 text (byte {e.start}: {e.reason}); give plain "
                            f"text files") from None
        except OSError as e:
            raise DataError(f"cannot read text source file {f!r}: {e.strerror or e}") from None
    if all(os.path.getsize(f) == 0 for f in files):
        return datasets.Dataset.from_dict({"text": []})
    return datasets.load_dataset("text", data_files=files, sample_by="paragraph", split="train")


def _text_files(pattern: str) -> list[str]:
    files = sorted(f for f in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(f))
    if not files:
        raise DataError(f"text source {pattern!r} matches no files; give a path or glob of plain-text files")
    return files


def _load_hf(arg: str, text_field: str):
    import datasets

    name, _, split = arg.partition("@")
    name, _, config = name.partition(":")
    datasets.utils.logging.set_verbosity_error()  # the failure below is reported in one line of ours
    import huggingface_hub

    huggingface_hub.utils.logging.set_verbosity_error()
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "train")
    except Exception as e:  # offline, unknown name, bad split...: one line, not a stack trace
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise DataError(f"could not load Hugging Face dataset {arg!r} ({reason}); without network use "
                        f"data.source=pydocs or data.source=text:PATH") from None
    if text_field not in ds.column_names:
        raise DataError(f"dataset {arg!r} has no text field {text_field!r}; columns: {', '.join(ds.column_names)}"
                        f" (set data.text_field)")
    return ds.select_columns([text_field]).rename_column(text_field, "text") if text_field != "text" else ds


def pydocs_documents() -> list[str]:
    """The documentation inside this Python installation, deterministically: one document per pydoc topic
    and one per standard-library module (its docstrings and those of its public classes and functions).

    Modules are parsed with `ast`, never imported, so collecting them has no side effects.
    """
    from pydoc_data.topics import topics

    docs = [f"{name}\n\n{text.strip()}" for name, text in sorted(topics.items())]
    stdlib = sysconfig.get_paths()["stdlib"]
    for name in sorted(sys.stdlib_module_names):
        if name in _SKIP or name.startswith("_"):
            continue
        for path in _module_files(stdlib, name):
            doc = _file_docs(path, os.path.relpath(path, stdlib))
            if doc:
                docs.append(doc)
    return docs


def _module_files(stdlib: str, name: str) -> list[str]:
    if os.path.isfile(single := os.path.join(stdlib, name + ".py")):
        return [single]
    files = []
    for folder, dirs, names in os.walk(os.path.join(stdlib, name)):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP and not d.startswith("test"))
        files += [os.path.join(folder, f) for f in sorted(names) if f.endswith(".py") and not f.startswith("test")]
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
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
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
