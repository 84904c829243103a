"""Tokenizers: GGUF-embedded (gpt2-style byte-level BPE), HF ``tokenizer.json``, and bytes.

Random-initialised presets have no vocabulary of their own; ``ByteTokenizer``
maps UTF-8 bytes to ids 0-255 and reserves 256/257 for BOS/EOS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """The model's Jinja chat template and the special tokens it refers to ("": none)."""

    template: str = ""
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def from_hf_config(cls, path: Path) -> ChatTemplate:
        """From a Hugging Face ``tokenizer_config.json`` (missing or unreadable: none)."""
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return cls()

        def token(value: object) -> str:
            if isinstance(value, dict):
                value = value.get("content")
            return value if isinstance(value, str) else ""

        template = raw.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        return cls(template if isinstance(template, str) else "", token(raw.get("bos_token")),
                   token(raw.get("eos_token")))


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    BOS, EOS = 256, 257

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 258:
            raise ValueError(f"vocab_size: byte tokenizer needs >= 258 ids, got {vocab_size}")
        self.eos_token_ids: tuple[int, ...] = (self.EOS,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
    """A ``tokenizers.Tokenizer`` with the model's EOS ids."""

    def __init__(self, tok: HFTokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self._tok = tok
        self.eos_token_ids = eos_token_ids
        self.chat: ChatTemplate = ChatTemplate()

    @classmethod
    def from_file(cls, path: Path, eos_token_ids: tuple[int, ...]) -> BPETokenizer:
        return cls(HFTokenizer.from_file(str(path)), eos_token_ids)

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any], source: str) -> BPETokenizer:
        """Build from ``tokenizer.ggml.*`` metadata (already decoded to Python values)."""
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"{source}: tokenizer.ggml.model {kind!r} unsupported (only 'gpt2' byte-level BPE)"
            )
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
        bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False)
        tok = HFTokenizer(bpe)
        # the pre-tokenizer of SmolLM/Llama-3 style vocabularies: digits split, byte-level regex
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
        tok.decoder = decoders.ByteLevel()
        types: list[int] = fields.get("tokenizer.ggml.token_type", [])
        special = [tokens[i] for i, t in enumerate(types) if t == 3]  # CONTROL tokens
        tok.add_special_tokens(special)
        eos = fields.get("tokenizer.ggml.eos_token_id")
        out = cls(tok, () if eos is None else (int(eos),))
        bos = fields.get("tokenizer.ggml.bos_token_id")
        out.chat = ChatTemplate(
            str(fields.get("tokenizer.chat_template") or ""),
            tokens[int(bos)] if bos is not None and 0 <= int(bos) < len(tokens) else "",
            tokens[int(eos)] if eos is not None and 0 <= int(eos) < len(tokens) else "")
        return out

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))
