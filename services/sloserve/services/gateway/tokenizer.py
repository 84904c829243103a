"""Prompt tokenization at the gateway: byte-level by default, the model's own tokenizer
when the executor ships one (``ExecutorDescription.tokenizer_json``, needs ``tokenizers``)."""

from __future__ import annotations

import codecs
from typing import Any, Protocol


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str:
        """The text this token completes (may be empty, e.g. mid UTF-8 character)."""
        ...


class ByteTokenizer:
    name = "byte"
    vocab_size = 256
    max_token_bytes = 1  # a prompt of n bytes is at least n / max_token_bytes tokens

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(t & 0xFF for t in ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def detokenizer(self) -> Detokenizer:
        return _ByteDetok()


class _ByteDetok:
    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return str(self._dec.decode(bytes([token_id & 0xFF])))


class ModelTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from its JSON."""

    name = "model"

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_str(tokenizer_json)
        self.vocab_size = int(self._tok.get_vocab_size())
        # the longest piece, 4 bytes a character at most: a prompt of n bytes is at least
        # n / max_token_bytes tokens (a bound checked before tokenizing a large prompt)
        self.max_token_bytes = 4 * max((len(t) for t in self._tok.get_vocab()), default=1)

    def encode(self, text: str, special: bool = False) -> list[int]:
        """``special``: add the tokenizer's special tokens (a BOS), as vLLM's /tokenize."""
        return list(self._tok.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: list[int]) -> str:
        """``ids`` as text, special tokens included (vLLM's /detokenize)."""
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def token_text(self, token_id: int) -> str:
        """One token's text (vLLM's logprobs ``token``: ``tokenizer.decode([id])``)."""
        return self.decode([token_id])

    def detokenizer(self) -> Detokenizer:
        return _StreamDetok(self._tok)


class _StreamDetok:
    """Incremental decode with ``tokenizers``' ``DecodeStream`` (a few tokens of context,
    as vLLM's incremental detokenizer): constant work per token where re-decoding the
    whole output grew with its length (issue 33, item 3). Its pieces join to the full
    decode (``skip_special_tokens``); an incomplete character waits for the next token."""

    def __init__(self, tok: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self._tok, self._stream = tok, DecodeStream(skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        return str(self._stream.step(self._tok, token_id) or "")


def make_tokenizer(tokenizer_json: str) -> ByteTokenizer | ModelTokenizer:
    return ModelTokenizer(tokenizer_json) if tokenizer_json else ByteTokenizer()
