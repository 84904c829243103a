"""Llama-family model shapes (GQA-aware) used by every performance model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    dtype_bytes: int = 2  # bf16/fp16

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        h, kv, f = self.hidden_size, self.kv_dim, self.intermediate_size
        return h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_embeddings else emb
        return self.num_layers * self.params_per_layer + emb + lm_head + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for one token over all layers."""
        return 2 * self.num_layers * self.kv_dim * self.dtype_bytes


_PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        ModelShape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000.0),
        ModelShape("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, rope_theta=1000000.0),
        ModelShape("qwen-14b-like", 40, 5120, 40, 40, 13696, 152064, 8192),
        ModelShape("codellama-34b", 48, 8192, 64, 8, 22016, 32000, 16384, rope_theta=1000000.0),
        ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        ModelShape(
            "smollm2-135m",
            30,
            576,
            9,
            3,
            1536,
            49152,
            8192,
            rope_theta=100000.0,
            tie_embeddings=True,
        ),
        ModelShape("tiny", 4, 256, 4, 2, 688, 512, 2048, tie_embeddings=False),
    )
}


def model_names() -> list[str]:
    return sorted(_PRESETS)


def get_model(name: str) -> ModelShape:
    """Return a preset by name; a clear error names the valid choices."""
    try:
        return _PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"model: unknown preset {name!r}; choose one of {model_names()}") from None
