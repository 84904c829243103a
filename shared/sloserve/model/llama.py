"""Llama-architecture transformer (RMSNorm, RoPE with llama-3 scaling, GQA, SwiGLU).

Module and parameter names follow Hugging Face's ``LlamaForCausalLM`` without
the ``model.`` prefix, so safetensors checkpoints load by name. The forward
pass takes the whole mixed batch flattened to ``[T]`` tokens: linear layers run
once over all tokens, attention per sequence through the paged cache.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sloserve.model.attention import AttentionMetadata, paged_attention
from sloserve.model.config import LlamaConfig
from sloserve.model.kv_cache import PagedKVCache


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse RoPE frequencies, with llama-3 / linear scaling applied (HF semantics)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.shape.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.rope_scaling
    if rs is None:
        return inv.float()
    if rs.rope_type == "linear":
        return (inv / rs.factor).float()
    old = rs.original_max_position_embeddings
    low_wavelen, high_wavelen = old / rs.low_freq_factor, old / rs.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (old / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; ``x`` [T, heads, d], ``cos``/``sin`` [T, 1, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        s, d = cfg.shape, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = s.num_heads, s.num_kv_heads, d
        self.q_proj = nn.Linear(s.hidden_size, s.num_heads * d, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(s.num_heads * d, s.hidden_size, bias=False)
        self.scale = d**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        o = paged_attention(q, k, v, kv[0], kv[1], meta, self.scale)
        out: torch.Tensor = self.o_proj(o.reshape(t, -1))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        h, f = cfg.shape.hidden_size, cfg.shape.intermediate_size
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.shape.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.shape.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, meta)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        s = cfg.shape
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        if s.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def init_random(self, seed: int) -> None:
        """Deterministic random weights (normal, std 0.02, as HF's initializer_range)."""
        gens: dict[torch.device, torch.Generator] = {}  # one stream per device, drawn there
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name == "norm.weight":
                    p.fill_(1.0)
                else:
                    gen = gens.get(p.device)
                    if gen is None:
                        gen = gens[p.device] = torch.Generator(p.device).manual_seed(seed)
                    p.copy_(torch.randn(p.shape, generator=gen, device=p.device) * 0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[T, hidden]`` of the flattened batch."""
        x = self.embed_tokens(input_ids)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layer(i), meta)
        out: torch.Tensor = self.norm(x)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(hidden).float()
        return out
