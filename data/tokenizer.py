"""A thin SentencePiece wrapper: encode / decode and the ids the rest of the code needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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

    def token_bytes(self) -> np.ndarray:
        """The UTF-8 bytes of text each id stands for (int64, one per id): a piece's text with
        SentencePiece's word-boundary mark U+2581 read as a space; a byte-fallback piece <0xNN> is 1
        byte; control, unknown and unused pieces (BOS, EOS, ...) 0. Summed over an encoding it is
        the text's UTF-8 length (the tokenizer adds no dummy prefix: data/prepare.py
        tokenizer_settings)."""
        sp = self.sp
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            if sp.is_byte(i):
                out[i] = 1
            elif not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)):
                out[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        return out
