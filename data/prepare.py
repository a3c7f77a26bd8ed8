"""Prepare a corpus once: split by document, train a SentencePiece BPE tokenizer on the train split,
tokenize with datasets.map and write data/prepared/<name>/{train.bin, val.bin, tokenizer.model,
meta.json}.

    python -m data.prepare                      # the embedded default corpus (pydocs)
    python -m data.prepare --source text:notes/*.txt --vocab-size 8192

The output is cached by a hash of the source and the settings; a directory only exists under its
final name once it is complete (built in a temporary folder, then renamed), so an interrupted
prepare never looks finished."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from data.sources import (
    DataError,
    corpus_sha256,
    describe,
    load_documents,
    parse_source,
    source_key,
)

FORMAT = 1  # bump when the output layout changes, to invalidate old caches
N_META_PIECES = 3 + 256  # unk, bos, eos and the byte-fallback pieces
MIN_COVERAGE = 0.98  # the lowest character_coverage SentencePiece accepts
MIN_VOCAB = 300  # the meta pieces + room for the commonest characters and some merges
# tokenize with several processes above this corpus size (below it, start-up dominates)
PARALLEL_BYTES = 16 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab <= 65536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def tokenizer_settings(vocab_size: int) -> dict:
    """SentencePiece BPE settings: byte fallback and identity normalization make decode(encode(t))
    == t."""
    return dict(
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        max_sentence_length=1 << 14,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
    )


def character_coverage(chars: Counter, vocab_size: int, coverage: float) -> float:
    """`coverage`, or lower where SentencePiece would need more single-character pieces than the
    vocabulary has room for (vocab_size - the 259 ids of unk/bos/eos and the 256 byte pieces - 1
    merge): then the share of the text covered by the most frequent characters that fit, and byte
    fallback encodes the rest.

    SentencePiece adds characters, most frequent first, while the share covered so far is below the
    coverage, so a coverage between the shares of the top k-1 and top k characters keeps exactly
    k; where that midpoint is below the 0.98 SentencePiece accepts, 0.98 itself (still in the
    interval, as the top k cover at least 98%)."""
    room = vocab_size - N_META_PIECES - 1
    total = sum(chars.values())
    counts = [n for _, n in chars.most_common()]
    if total == 0 or room >= len(counts) or sum(counts[:room]) >= coverage * total:
        return coverage
    covered_k, covered_before = sum(counts[:room]), sum(counts[: room - 1])
    if covered_k < MIN_COVERAGE * total:  # SentencePiece refuses a coverage below 0.98
        needed = next(
            k for k in range(1, len(counts) + 1) if sum(counts[:k]) >= MIN_COVERAGE * total
        )
        raise DataError(
            f"data.vocab_size={vocab_size} is too small for this corpus: its commonest characters "
            f"covering {MIN_COVERAGE:.0%} of the text need data.vocab_size >= "
            f"{N_META_PIECES + needed + 1}"
        )
    return max((covered_before + covered_k) / 2 / total, MIN_COVERAGE)


# What helps when SentencePiece refuses a corpus, by a phrase of its message (first match wins).
TOKENIZER_HINTS = {
    "too high": "lower data.vocab_size or use a larger corpus",
    "character_coverage": "raise data.vocab_size: the corpus has more characters than it fits",
}
TOKENIZER_HINT = "check data.vocab_size against the corpus"


def tokenizer_hint(reason: str) -> str:
    """The advice for a SentencePiece error message: TOKENIZER_HINTS, else TOKENIZER_HINT."""
    return next((h for k, h in TOKENIZER_HINTS.items() if k in reason), TOKENIZER_HINT)


def dataset_name(source: str, vocab_size: int, digest: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", source).strip("-").lower()[:40]
    return f"{slug}-v{vocab_size}-{digest[:10]}"


def prepare(
    source: str = "pydocs",
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    seed: int = 1337,
    text_field: str = "text",
    root: str | Path = "data/prepared",
    max_tokens: int = 0,
    max_tokenizer_lines: int = 2_000_000,
    verbose: bool = True,
) -> Path:
    """The prepared directory for this source and these settings, building it if it is not cached.
    `max_tokens` (> 0) caps the training split at that many tokens; a hub source is then streamed,
    and read only until its documents hold 8 bytes per token of the budget (more than any tokenizer
    here needs)."""
    if max_tokens < 0:
        raise DataError(f"data.max_tokens must be >= 0 (0: the whole source), got {max_tokens}")
    if not 0 < val_fraction < 1:
        raise DataError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
    if vocab_size < MIN_VOCAB:
        raise DataError(
            f"data.vocab_size must be >= {MIN_VOCAB} ({N_META_PIECES} ids for the special and byte "
            f"pieces, the rest for characters and merges), got {vocab_size}"
        )
    key = {
        "format": FORMAT,
        **source_key(source, text_field),
        "vocab_size": vocab_size,
        "val_fraction": val_fraction,
        "seed": seed,
        "max_tokenizer_lines": max_tokenizer_lines,
        **({"max_tokens": max_tokens} if max_tokens else {}),
    }  # absent when off: older caches keep their names
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    root = Path(root)
    out = root / dataset_name(source, vocab_size, digest)
    if _is_complete(out, digest):
        return out
    root.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    # concurrent runs (sweeps, torchrun) prepare only once
    with FileLock(str(root / f".{out.name}.lock")):
        if _is_complete(out, digest):
            return out
        tmp = root / f".{out.name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of an interrupted prepare
        tmp.mkdir()
        try:
            _build(
                tmp,
                source,
                key,
                digest,
                vocab_size,
                val_fraction,
                seed,
                text_field,
                max_tokenizer_lines,
                verbose,
                max_tokens,
            )
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _is_complete(out: Path, digest: str) -> bool:
    """Whether `out` holds this dataset. A directory only gets its final name once complete, so one
    whose meta.json cannot be read is damaged storage: DataError, rather than silently building over
    it."""
    if not out.exists():
        return False
    try:
        return json.loads((out / "meta.json").read_text())["digest"] == digest
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"prepared dataset {out} is damaged: cannot read its meta.json ({e}); delete the "
            f"directory to prepare it again"
        ) from None


def _log(verbose: bool, msg: str) -> None:
    if verbose:
        print(f"[prepare] {msg}", flush=True)  # progress: stdout


def _build(
    tmp: Path,
    source: str,
    key: dict,
    digest: str,
    vocab_size: int,
    val_fraction: float,
    seed: int,
    text_field: str,
    max_tokenizer_lines: int,
    verbose: bool,
    max_tokens: int = 0,
) -> None:
    import datasets
    import sentencepiece as spm

    t0 = time.time()
    local = not source.startswith("hf:")
    if not local:  # a download: say so before it starts
        _log(verbose, f"loading {describe(source)}")
    # local corpora load in seconds: bars would only bury a bad-input error line
    with _quiet(local):
        docs = load_documents(source, text_field, 8 * max_tokens).filter(
            lambda t: bool(t and t.strip()), input_columns="text"
        )
    if len(docs) < 2:
        raise DataError(
            f"data source {source!r} has {len(docs)} non-empty documents; need at least 2 "
            f"(one for train, one for val)"
        )
    if local:
        _log(verbose, f"loaded {describe(source)}: {len(docs):,} documents")
    # split by document, deterministically: a seeded permutation, each split kept in corpus order
    perm = np.random.default_rng(seed).permutation(len(docs))
    n_val = min(len(docs) - 1, max(1, round(len(docs) * val_fraction)))
    splits = {
        "val": docs.select(np.sort(perm[:n_val])),
        "train": docs.select(np.sort(perm[n_val:])),
    }

    _log(
        verbose,
        f"training a {vocab_size}-piece BPE tokenizer on {len(splits['train'])} train documents",
    )
    settings = tokenizer_settings(vocab_size)
    settings["character_coverage"] = character_coverage(
        Counter(c for line in _lines(splits["train"], max_tokenizer_lines) for c in line),
        vocab_size,
        settings["character_coverage"],
    )
    if settings["character_coverage"] < tokenizer_settings(vocab_size)["character_coverage"]:
        _log(
            verbose,
            f"character_coverage lowered to {settings['character_coverage']:.4f} so that the "
            "characters fit "
            f"a {vocab_size}-piece vocabulary; rarer characters are encoded as bytes",
        )
    proto = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_lines(splits["train"], max_tokenizer_lines),
            model_writer=proto,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
            **settings,
        )
    except RuntimeError as e:
        reason = (
            str(e).strip().splitlines()[-1].rsplit("] ", 1)[-1]
        )  # drop SentencePiece's source location
        raise DataError(
            f"cannot train the tokenizer on {source!r}: {reason} ({tokenizer_hint(reason)})"
        ) from None
    (tmp / "tokenizer.model").write_bytes(proto.getvalue())

    from data.tokenizer import Tokenizer

    tok = Tokenizer(proto.getvalue())
    dtype = token_dtype(vocab_size)
    counts = {}
    n_bytes = sum(len(t.encode("utf-8")) for t in splits["train"]["text"])
    num_proc = min(os.cpu_count() or 1, 8) if n_bytes > PARALLEL_BYTES else None
    for split, ds in splits.items():
        t1 = time.time()
        with _quiet(True):  # datasets' own bar redraws per process: one line of ours per split
            ids = ds.map(
                _Encoder(proto.getvalue()),
                batched=True,
                remove_columns=ds.column_names,
                num_proc=num_proc,
                load_from_cache_file=False,
            )
        counts[split] = _write_tokens(
            ids, tmp / f"{split}.bin", dtype, max_tokens if split == "train" else 0
        )
        _log(
            verbose,
            f"tokenized {split}: {len(ds):,} documents, {counts[split]:,} tokens, "
            f"{time.time() - t1:.1f}s",
        )
    train = np.memmap(tmp / "train.bin", dtype=dtype, mode="r")
    p = np.bincount(train, minlength=vocab_size) / len(train)
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    meta = {
        "digest": digest,
        "key": key,
        "source": source,
        "description": describe(source),
        "vocab_size": tok.vocab_size,
        "dtype": dtype.name,
        "eos_id": tok.eos_id,
        "train_tokens": counts["train"],
        "val_tokens": counts["val"],
        "train_documents": len(splits["train"]),
        "val_documents": len(splits["val"]),
        "corpus_bytes": n_bytes
        + sum(len(t.encode("utf-8")) for t in splits["val"]["text"]),  # UTF-8 bytes
        "corpus_sha256": corpus_sha256(docs["text"]),
        # nats per token: the loss of a model that learned only token frequencies
        "unigram_entropy": entropy,
        "tokenizer": settings,
        "versions": {
            "python": sys.version.split()[0],
            "sentencepiece": spm.__version__,
            "datasets": datasets.__version__,
            "numpy": np.__version__,
        },
    }
    # written last: marks completion
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    _log(
        verbose,
        f"{counts['train']:,} train / {counts['val']:,} val tokens, unigram entropy "
        f"{entropy:.3f} nats, {time.time() - t0:.1f}s",
    )


@contextmanager
def _quiet(enabled: bool):
    """datasets' progress bars off while the block runs (if enabled), restored after."""
    import datasets

    was = datasets.utils.logging.is_progress_bar_enabled()
    if enabled:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled and was:
            datasets.enable_progress_bars()


def _lines(ds, limit: int):
    """The non-empty lines of the documents, at most `limit`, in corpus order (SentencePiece's
    sentences)."""
    n = 0
    for batch in ds.iter(batch_size=1000):
        for text in batch["text"]:
            for line in text.splitlines():
                if line.strip():
                    yield line
                    n += 1
                    if n >= limit:
                        return


class _Encoder:
    """datasets.map function: texts -> token ids with an end-of-text id after each document
    (picklable)."""

    def __init__(self, proto: bytes):
        self.proto, self.tok = proto, None

    def __call__(self, batch: dict) -> dict:
        if self.tok is None:
            from data.tokenizer import Tokenizer

            self.tok = Tokenizer(self.proto)
        return {"ids": [ids + [self.tok.eos_id] for ids in self.tok.encode_batch(batch["text"])]}

    def __getstate__(self):
        return {"proto": self.proto, "tok": None}


def _write_tokens(ds, path: Path, dtype: np.dtype, limit: int = 0) -> int:
    """Write the token ids of every document in order (at most `limit`, when > 0); the number
    written."""
    n = 0
    with open(path, "wb") as f:
        for batch in ds.iter(batch_size=1000):
            arr = np.fromiter((i for ids in batch["ids"] for i in ids), dtype=dtype)
            if limit:
                arr = arr[: limit - n]
            f.write(arr.tobytes())
            n += len(arr)
            if limit and n >= limit:
                break
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--source",
        default="pydocs",
        help="pydocs | pystdlib | text:PATH_OR_GLOB | hf:NAME[:CONFIG][@SPLIT][#REVISION]",
    )
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--text-field", default="text", help="column holding the text (hf sources)")
    p.add_argument("--root", default="data/prepared")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="cap the training split at this many tokens (0: all)",
    )
    args = p.parse_args(argv)
    try:
        parse_source(args.source)
        out = prepare(
            args.source,
            args.vocab_size,
            args.val_fraction,
            args.seed,
            args.text_field,
            args.root,
            args.max_tokens,
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = json.loads((out / "meta.json").read_text())
    print(
        f"{out}: {meta['corpus_bytes']:,} bytes, {meta['train_tokens']:,} train + "
        f"{meta['val_tokens']:,} val "
        f"tokens, vocab {meta['vocab_size']}, unigram entropy {meta['unigram_entropy']:.3f} nats"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
