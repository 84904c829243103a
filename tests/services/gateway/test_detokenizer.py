"""The model tokenizer's incremental detokenizer (issue 33, item 3): constant work per token,
and its pieces join to the full decode, also where one character spans several tokens."""

from __future__ import annotations

import random

from sloserve.services.gateway.tokenizer import ModelTokenizer
from sloserve.services.model_store import resolve


def _tokenizer() -> ModelTokenizer:
    return ModelTokenizer((resolve("smollm2-135m") / "tokenizer.json").read_text())


def test_pieces_join_to_the_full_decode_with_split_characters_and_special_tokens() -> None:
    tok = _tokenizer()
    text = "Paris. Ünïcödé ✓ 日本語 🚀🚀\n\n  tabs\t<|im_end|> done"
    ids = tok.encode(text)
    rng = random.Random(0)
    for seq in [ids] + [[rng.randrange(tok.vocab_size) for _ in range(300)] for _ in range(5)]:
        d = tok.detokenizer()
        pieces = [d.push(t) for t in seq]
        assert "".join(pieces) == tok._tok.decode(seq, skip_special_tokens=True)
