"""Data preparation, the embedded corpus, the tokenizer and the batch loader."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_corpus

from data import prepare as prep
from data.loader import BatchLoader, eval_batches, load_tokens
from data.sources import pydocs_documents
from data.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent


def test_round_trip_on_held_out_text(prepared):
    tok = Tokenizer(prepared / "tokenizer.model")
    held_out = [
        "The norm of the residual stream grows.",
        "  two  spaces,\ttabs\nand lines\n\n",
        "unseen: naïve façade — 数字 ✓ {x: 1e-5}",
        "Stable training at a learning rate of 3e-3!",
    ]
    for text in held_out:
        assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 320 and tok.eos_id == 2


def test_prepare_is_deterministic_and_records_meta(prepared, corpus_file, tmp_path):
    again = prep.prepare(
        f"text:{corpus_file}", vocab_size=320, val_fraction=0.1, root=tmp_path, verbose=False
    )
    for name in ("train.bin", "val.bin", "tokenizer.model", "meta.json"):
        assert (again / name).read_bytes() == (prepared / name).read_bytes(), name
    meta = json.loads((prepared / "meta.json").read_text())
    train, val = load_tokens(prepared, "train"), load_tokens(prepared, "val")
    assert meta["train_tokens"] == len(train) > 10 * meta["val_tokens"] / 2 and meta[
        "val_tokens"
    ] == len(val)
    assert train.dtype == np.uint16 and train.max() < 320
    assert meta["train_documents"] + meta["val_documents"] == 300 and meta["val_documents"] == 30
    # the unigram entropy is that of the train tokens, in nats
    p = np.bincount(train, minlength=320) / len(train)
    assert meta["unigram_entropy"] == pytest.approx(-(p[p > 0] * np.log(p[p > 0])).sum(), rel=1e-9)
    assert {"corpus_sha256", "tokenizer", "versions", "source", "vocab_size"} <= meta.keys()


def test_second_prepare_is_a_cache_hit(prepared, corpus_file, monkeypatch):
    monkeypatch.setattr(prep, "_build", lambda *a, **k: pytest.fail("rebuilt a cached dataset"))
    root = prepared.parent
    assert (
        prep.prepare(f"text:{corpus_file}", vocab_size=320, val_fraction=0.1, root=root) == prepared
    )


def test_interrupted_prepare_is_not_mistaken_for_finished(corpus_file, tmp_path, monkeypatch):
    def crash(tmp, *a, **k):
        (tmp / "train.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_build", crash)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(f"text:{corpus_file}", vocab_size=320, root=tmp_path, verbose=False)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_vocab_below_the_character_count_trains_with_byte_fallback(tmp_path):
    # 120 distinct characters (Greek, Cyrillic, CJK) need more single-character pieces than a
    # 320-piece vocabulary has room for next to the 259 byte and special pieces: the rarest go
    # through byte fallback
    rng = np.random.default_rng(0)
    codes = [*range(0x61, 0x7B), *range(0x3B1, 0x3C9), *range(0x430, 0x450), *range(0x4E00, 0x4E2A)]
    alphabet = [chr(c) for c in codes]
    weights = 1.0 / np.arange(1, len(alphabet) + 1) ** 2  # a few common, many rare characters
    text = "\n\n".join(
        " ".join(
            "".join(rng.choice(alphabet, size=rng.integers(2, 8), p=weights / weights.sum()))
            for _ in range(12)
        )
        for _ in range(400)
    )
    (tmp_path / "many.txt").write_text(text)
    out = prep.prepare(
        f"text:{tmp_path / 'many.txt'}",
        vocab_size=320,
        val_fraction=0.1,
        root=tmp_path / "p",
        verbose=False,
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer"]["character_coverage"] < 0.9995
    tok = Tokenizer(out / "tokenizer.model")
    held_out = "".join(alphabet) + " αβγ 一丁"
    assert tok.decode(tok.encode(held_out)) == held_out  # rare characters round-trip as bytes


def test_character_coverage_keeps_exactly_what_fits():
    from collections import Counter

    # the top 60 cover > 98%
    chars = Counter({chr(65 + i): 10**6 // (i + 1) ** 2 for i in range(90)})
    assert prep.character_coverage(chars, 4096, 0.9995) == 0.9995  # everything fits: unchanged
    c = prep.character_coverage(chars, 320, 0.9995)  # room for 320 - 259 - 1 = 60 characters
    total, counts = sum(chars.values()), sorted(chars.values(), reverse=True)
    # SentencePiece then keeps the top 60
    assert sum(counts[:59]) / total < c <= sum(counts[:60]) / total
    with pytest.raises(prep.DataError, match="need data.vocab_size >= 347"):  # 87 of 88 cover 98%
        prep.character_coverage(Counter({chr(65 + i): 1 for i in range(88)}), 320, 0.9995)


def test_character_coverage_never_goes_below_what_sentencepiece_accepts():
    from collections import Counter

    # 60 characters fit; the top 59 cover 97.9%, the top 60 98.0%: the midpoint, 97.95%, would be
    # refused (pystdlib at vocab 320 was such a corpus), 0.98 keeps the top 60
    chars = Counter({chr(65 + i): 979 // 59 + (i < 979 % 59) for i in range(59)})
    chars[chr(65 + 59)] = 1
    chars.update({chr(200 + i): 1 for i in range(20)})
    total, counts = sum(chars.values()), sorted(chars.values(), reverse=True)
    assert sum(counts[:59]) / total < prep.MIN_COVERAGE <= sum(counts[:60]) / total
    c = prep.character_coverage(chars, 320, 0.9995)
    assert c >= prep.MIN_COVERAGE and sum(counts[:59]) / total < c <= sum(counts[:60]) / total


def test_a_refused_tokenizer_hint_says_which_way_vocab_size_helps():
    too_few = "trainer_spec.character_coverage() >= 0.98 && ... <= 1.0"
    too_many = "Vocabulary size too high (4096). Please set it to a value <= 1500."
    assert "raise data.vocab_size" in prep.tokenizer_hint(too_few)
    assert "lower data.vocab_size" in prep.tokenizer_hint(too_many)
    assert prep.tokenizer_hint("something else") == prep.TOKENIZER_HINT


def test_token_dtype_rule():
    assert prep.token_dtype(4096) == np.uint16 and prep.token_dtype(65536) == np.uint16
    assert prep.token_dtype(65537) == np.uint32 and prep.token_dtype(128_256) == np.uint32


@pytest.mark.slow  # reads the whole standard library's documentation twice
def test_pydocs_is_deterministic_and_large_enough():
    a, b = pydocs_documents(), pydocs_documents()
    assert a == b
    assert len(a) > 400 and sum(map(len, a)) > 1_000_000  # ~1.8 MB on CPython 3.11


def _loader(tokens, **kw):
    return BatchLoader(tokens, **{"seq_len": 16, "batch_size": 8, "seed": 0, **kw})


def test_loader_same_seed_same_batches_and_resume(prepared):
    tokens = load_tokens(prepared, "train")
    a, b, c = _loader(tokens), _loader(tokens), _loader(tokens, seed=1)
    batches = [next(a) for _ in range(5)]
    assert all(
        (x == y).all() for (x, _), (y, _) in zip(batches, [next(b) for _ in range(5)], strict=True)
    )
    assert not (next(c)[0] == batches[0][0]).all()
    x, y = batches[0]
    assert x.shape == (8, 16) and (x[:, 1:] == y[:, :-1]).all()
    # save after 3 steps, restore into a fresh loader: the continuation is identical
    state = _loader(tokens)
    for _ in range(3):
        next(state)
    resumed = _loader(tokens)
    resumed.load_state_dict(state.state_dict())
    assert (next(resumed)[0] == batches[3][0]).all() and (next(resumed)[0] == batches[4][0]).all()


def test_loader_epoch_covers_windows_once(prepared):
    tokens = load_tokens(prepared, "train")
    loader = _loader(tokens, batch_size=1)
    starts = [loader.starts(s)[0] for s in range(loader.n_windows)]
    assert len(set(starts)) == loader.n_windows  # no window twice in an epoch
    assert len({s % 16 for s in starts}) == 1  # one offset per epoch


def test_two_ranks_draw_disjoint_halves_of_the_global_batch(prepared):
    tokens = load_tokens(prepared, "train")
    single = _loader(tokens)
    r0, r1 = _loader(tokens, rank=0, world_size=2), _loader(tokens, rank=1, world_size=2)
    for step in range(4):
        s0, s1 = r0.starts(step), r1.starts(step)
        assert not set(s0) & set(s1)
        assert s0 + s1 == single.starts(step)
    ev = [list(eval_batches(tokens, 16, 4, 160, rank=r, world_size=2)) for r in (0, 1)]
    assert sum(x.shape[0] for x, _, counts in ev[0] + ev[1] if counts) == 10


@pytest.mark.parametrize(
    "windows,world,batch", [(5, 2, 2), (3, 4, 1), (3, 4, 2), (9, 4, 2), (8, 4, 2), (1, 2, 4)]
)
def test_every_rank_gets_as_many_eval_batches_and_each_window_counts_once(windows, world, batch):
    """A sharded forward is a collective: a rank with fewer eval batches would leave the others
    waiting (5 windows on 2 ranks with micro 2 gave 2 and 1 batches; 3 windows on 4 ranks gave one
    rank none). Padding batches repeat a real window and count 0."""
    tokens = np.arange(windows * 16 + 1, dtype=np.uint16)
    per_rank = [
        list(eval_batches(tokens, 16, batch, 0, rank=r, world_size=world)) for r in range(world)
    ]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) >= 1
    counted = sorted(
        int(x[i, 0]) // 16 for b in per_rank for x, _, counts in b if counts for i in range(len(x))
    )
    assert counted == list(range(windows))
    for b in per_rank:
        for x, y, _ in b:
            assert x.shape[1] == 16 and torch.equal(x[:, 1:], y[:, :-1])


def test_too_small_eval_set_fails_when_asked_not_at_the_first_batch():
    from data.sources import DataError

    with pytest.raises(DataError, match="too few"):
        eval_batches(np.arange(5, dtype=np.uint16), 16, 4, 1024)


def _run_prepare(args, tmp_path):
    return subprocess.run(
        [sys.executable, "-m", "data.prepare", "--root", str(tmp_path / "out"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )


@pytest.mark.parametrize(
    "case,match",
    [
        ("missing", "matches no files"),
        ("empty", "has 0 non-empty documents"),
        ("vocab", "cannot train the tokenizer"),
        ("tiny_vocab", "data.vocab_size must be >= 300"),
        ("hf", "could not load Hugging Face dataset"),
        ("kind", "unknown data source 'ftp:x'; valid: pydocs, pystdlib, text:"),
    ],
)
@pytest.mark.slow
def test_bad_input_one_clear_line(case, match, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    small = tmp_path / "small.txt"
    write_corpus(small, paragraphs=5)
    args = {
        "missing": ["--source", f"text:{tmp_path}/nope/*.txt"],
        "empty": ["--source", f"text:{empty}"],
        "vocab": ["--source", f"text:{small}", "--vocab-size", "5000"],
        "tiny_vocab": ["--source", f"text:{small}", "--vocab-size", "280"],
        "hf": ["--source", "hf:nonexistent/dataset-xyz"],
        "kind": ["--source", "ftp:x"],
    }[case]
    r = _run_prepare(args, tmp_path)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and match in last and "Traceback" not in r.stderr
    out = tmp_path / "out"
    assert not out.exists() or not [p for p in out.iterdir() if p.is_dir()]


def test_pystdlib_is_the_standard_librarys_source_one_unique_document_per_file():
    from data.sources import pystdlib_documents, stdlib_files

    docs = pystdlib_documents()
    # deterministic, deduplicated
    assert docs == pystdlib_documents() and len(set(docs)) == len(docs)
    # ~9.7 MB on CPython 3.11
    assert len(docs) > 400 and sum(len(d.encode()) for d in docs) > 5_000_000
    with open(stdlib_files()[0][0], encoding="utf-8") as f:
        first = f.read()
    # a document is a whole file, as it is on disk: the split by document splits files
    assert first in docs


def test_token_bytes_sum_to_the_texts_utf8_length(prepared):
    """Bits per byte divides by the bytes the tokens encode: summed over an encoding, exactly the
    text's UTF-8 length (byte-fallback pieces are 1 byte each, as the rare characters show; no dummy
    prefix is added)."""
    tok = Tokenizer(prepared / "tokenizer.model")
    nbytes = tok.token_bytes()
    assert nbytes.shape == (tok.vocab_size,) and nbytes[tok.eos_id] == 0
    for text in [
        "The norm of the residual stream grows.",
        "unseen: naïve façade — 数字 ✓ {x: 1e-5}",
        "tabs\tand\nlines\n\nand  two  spaces",
    ]:
        ids = tok.encode(text)
        assert int(nbytes[ids].sum()) == len(text.encode("utf-8")), text


def test_bits_per_byte_on_a_constructed_tokenizer_known_by_hand():
    """A model that predicts every one of V = 64 tokens alike (loss ln 64 per token) over tokens
    that each stand for 2 bytes of text: bpb = log2(64) / 2 = 3 bits per byte, exactly; and the
    formula on its own."""
    from training import distributed
    from training.config import load_config
    from training.evaluate import bits_per_byte, evaluate

    class Uniform(torch.nn.Module):
        def forward(self, x, y):
            logits = torch.zeros(*x.shape, 64)
            return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    cfg = load_config(None, ["train.seq_len=8", "train.eval_tokens=0"])
    d = distributed.Dist()
    tokens = np.arange(200, dtype=np.uint16) % 64
    out = evaluate(
        Uniform(),
        tokens,
        cfg,
        d,
        torch.autocast("cpu", enabled=False),
        4,
        torch.full((64,), 2, dtype=torch.int64),
    )
    assert out["val/loss"] == pytest.approx(np.log(64)) and out["val/bpb"] == pytest.approx(3.0)
    assert bits_per_byte(100 * np.log(2), 50) == pytest.approx(2.0)


def test_a_hub_source_at_a_revision_streams_and_is_capped_offline(tmp_path):
    """The hf: form with a pinned revision and a token budget, on a local dataset saved in the hub's
    layout (a folder of parquet data files, loaded offline): streamed until the budget's bytes, the
    train split cut at it."""
    import datasets

    folder = tmp_path / "stories" / "data"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "home", "quickly", "dog"]
    texts = [" ".join(rng.choice(words, 40)) + "." for _ in range(3000)]
    datasets.Dataset.from_dict({"text": texts, "id": list(range(len(texts)))}).to_parquet(
        folder / "train-00000-of-00001.parquet"
    )
    source = f"hf:{tmp_path / 'stories'}@train#0123456789abcdef0123456789abcdef01234567"
    out = prep.prepare(
        source, vocab_size=320, root=tmp_path / "prepared", max_tokens=5000, verbose=False
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["train_tokens"] == 5000 and len(load_tokens(out, "train")) == 5000
    # streamed: read only up to the budget
    assert meta["train_documents"] + meta["val_documents"] < 3000
    assert "0123456789abcdef" in json.dumps(meta["key"])  # the revision is in the cache key
    again = prep.prepare(
        source.replace("#0123", "#9123"),
        vocab_size=320,
        root=tmp_path / "prepared",
        max_tokens=5000,
        verbose=False,
    )
    assert again != out  # another revision is another prepared dataset


def test_preparing_prints_one_line_per_stage_and_no_datasets_bars(tmp_path, capfd):
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnop"), size=5)) for _ in range(400)]
    text = "\n\n".join(" ".join(rng.choice(words, size=80)) for _ in range(60))
    (tmp_path / "c.txt").write_text(text)
    prep.prepare(f"text:{tmp_path / 'c.txt'}", vocab_size=320, root=tmp_path / "p", verbose=True)
    out, err = capfd.readouterr()
    assert "examples/s" not in out + err and "%|" not in out + err  # datasets' bars silenced
    lines = [line for line in out.replace("\r", "\n").splitlines() if line.strip()]
    for stage in ("tokenized val:", "tokenized train:"):
        assert sum(stage in line for line in lines) == 1, lines
