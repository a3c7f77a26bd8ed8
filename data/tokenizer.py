"""A thin SentencePiece wrapper: encode / decode and the ids the rest of the code needs."""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm


class Tokenizer:
    """encode(text) -> ids and decode(ids) -> text with a prepared dataset's tokenizer.model."""

    def __init__(self, model: str | Path | bytes):
        proto = model if isinstance(model, bytes) else Path(model).read_bytes()
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        self.vocab_size: int = self.sp.get_piece_size()
        self.eos_id: int = self.sp.eos_id()

    def encode(self, text: str, eos: bool = False) -> list[int]:
        ids = self.sp.encode(text)
        return ids + [self.eos_id] if eos else ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])
