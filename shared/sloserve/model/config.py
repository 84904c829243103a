"""Llama-architecture configuration: a ``ModelShape`` plus what the forward pass needs.

Shapes come from ``sloserve.perf.models`` (one table for perf models and the
real executor); this adds the norm epsilon, RoPE scaling (llama-3 style) and
special token ids. ``from_hf_config`` reads a Hugging Face ``config.json`` dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sloserve.perf.models import ModelShape, get_model, model_names


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling: ``llama3`` (Llama 3.1 long context) or ``linear``."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("llama3", "linear"):
            raise ValueError(
                f"rope_scaling.rope_type: unsupported {self.rope_type!r}; use 'llama3' or 'linear'"
            )
        if not self.factor > 0:
            raise ValueError(f"rope_scaling.factor: must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError("rope_scaling: high_freq_factor must exceed low_freq_factor")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    shape: ModelShape
    rms_eps: float = 1e-5
    rope_scaling: RopeScaling | None = None
    head_dim: int = 0  # 0 = hidden_size // num_heads
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        s = self.shape
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", s.hidden_size // s.num_heads)
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                     "intermediate_size", "vocab_size", "max_context"):
            if getattr(s, name) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(s, name)}")
        if s.num_heads % s.num_kv_heads:
            raise ValueError(
                f"model config: num_heads {s.num_heads} not divisible by "
                f"num_kv_heads {s.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def name(self) -> str:
        return self.shape.name

    def perf_shape(self, dtype_bytes: int) -> ModelShape:
        """The shape the perf models should use for weights/KV held in ``dtype_bytes``."""
        return dataclasses.replace(self.shape, dtype_bytes=dtype_bytes)


_LLAMA31_SCALING = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)

# name -> (base ModelShape preset, replaced shape fields, extra LlamaConfig fields)
_PRESETS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "tiny": ("tiny", {}, {"eos_token_ids": (257,), "bos_token_id": 256}),
    "smollm2-135m": ("smollm2-135m", {}, {"bos_token_id": 1, "eos_token_ids": (2,)}),
    "llama-2-7b": ("llama-2-7b", {}, {"bos_token_id": 1, "eos_token_ids": (2,)}),
    "llama-3-8b": ("llama-3-8b", {}, {"bos_token_id": 128000, "eos_token_ids": (128001, 128009)}),
    "llama-3.1-8b": (
        "llama-3-8b",
        {"name": "llama-3.1-8b", "max_context": 131072},
        {"bos_token_id": 128000, "eos_token_ids": (128001, 128008, 128009),
         "rope_scaling": _LLAMA31_SCALING},
    ),
}


def config_names() -> list[str]:
    return sorted(set(_PRESETS) | set(model_names()))


def get_config(name: str) -> LlamaConfig:
    """A preset's config; any ``sloserve.perf.models`` shape works with defaults."""
    base, shape_fields, extra = _PRESETS.get(name.lower(), (name, {}, {}))
    try:
        shape = get_model(base)
    except ValueError:
        raise ValueError(
            f"model: unknown preset {name!r}; choose one of {config_names()}"
        ) from None
    return LlamaConfig(dataclasses.replace(shape, **shape_fields), **extra)


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)


def from_hf_config(d: dict[str, Any], name: str = "hf") -> LlamaConfig:
    """``LlamaConfig`` from a Hugging Face ``config.json`` (LlamaForCausalLM family)."""
    for flag in ("attention_bias", "mlp_bias"):
        if d.get(flag):
            raise ValueError(f"config.json: {flag}=true is not supported (Llama has no biases)")
    # transformers >= 5 nests rope_theta and the scaling in "rope_parameters"
    rope_params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or rope_params
    try:
        heads = int(d["num_attention_heads"])
        shape = ModelShape(
            name=name,
            num_layers=int(d["num_hidden_layers"]),
            hidden_size=int(d["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            intermediate_size=int(d["intermediate_size"]),
            vocab_size=int(d["vocab_size"]),
            max_context=int(d.get("max_position_embeddings", 2048)),
            rope_theta=float(d.get("rope_theta") or rope_params.get("rope_theta", 10000.0)),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise ValueError(f"config.json: missing field {e.args[0]!r}") from None
    rope = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in (None, "default"):
            rope = RopeScaling(
                rope_type=str(kind),
                factor=float(scaling.get("factor", 1.0)),
                low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
                high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
                original_max_position_embeddings=int(
                    scaling.get("original_max_position_embeddings", 8192)
                ),
            )
    return LlamaConfig(
        shape,
        rms_eps=float(d.get("rms_norm_eps", 1e-5)),
        rope_scaling=rope,
        head_dim=int(d.get("head_dim") or 0),
        bos_token_id=None if d.get("bos_token_id") is None else int(d["bos_token_id"]),
        eos_token_ids=_ids(d.get("eos_token_id")),
    )
