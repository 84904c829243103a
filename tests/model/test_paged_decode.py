"""Paged decode equals a dense reference transformer written independently here.

The reference recomputes the whole sequence with plain tensor ops (complex
RoPE, explicit causal softmax, GQA by repeating K/V heads) from the model's
weights; the engine path prefills, then decodes token by token through a
scattered block table, several sequences per batch. Tolerance: float32,
atol 1e-4 on logits (observed ~1e-6).
"""

from __future__ import annotations

import random

import torch

from sloserve.model.attention import build_metadata
from sloserve.model.config import LlamaConfig, get_config
from sloserve.model.kv_cache import PagedKVCache
from sloserve.model.llama import LlamaModel

ATOL = 1e-4
CPU = torch.device("cpu")


def dense_logits(model: LlamaModel, tokens: list[int]) -> torch.Tensor:
    """Logits at every position of ``tokens``, no cache, no paging."""
    cfg: LlamaConfig = model.cfg
    s, d = cfg.shape, cfg.head_dim
    w = {k: v.detach() for k, v in model.state_dict().items()}
    n = len(tokens)

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_eps)

    freqs = 1.0 / s.rope_theta ** (torch.arange(0, d, 2).double() / d)
    angles = torch.outer(torch.arange(n).double(), freqs)
    rot = torch.polar(torch.ones_like(angles), angles)  # [n, d/2]

    def rope(x: torch.Tensor) -> torch.Tensor:  # rotate-half layout: pairs (i, i + d/2)
        half = d // 2
        z = torch.complex(x[..., :half].double(), x[..., half:].double()) * rot[:, None, :]
        return torch.cat([z.real, z.imag], -1).float()

    x = w["embed_tokens.weight"][torch.tensor(tokens)]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    group = s.num_heads // s.num_kv_heads
    for i in range(s.num_layers):
        p = f"layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(n, s.num_heads, d))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(n, s.num_kv_heads, d))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, s.num_kv_heads, d)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
        att = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["norm.weight"]) @ w["lm_head.weight"].T


def test_paged_decode_equals_dense_reference() -> None:
    model = LlamaModel(get_config("tiny"))
    model.init_random(3)
    model.eval()
    s = model.cfg.shape
    block_size, num_blocks = 8, 48
    cache = PagedKVCache(s.num_layers, num_blocks, block_size, s.num_kv_heads,
                         model.cfg.head_dim, torch.float32, CPU)
    rng = random.Random(3)
    blocks = rng.sample(range(num_blocks), num_blocks)
    prompts = [[rng.randrange(s.vocab_size) for _ in range(n)] for n in (5, 19, 33)]
    tables = [blocks[0:8], blocks[8:16], blocks[16:24]]
    # prefill all three prompts in one batch
    meta = build_metadata([(0, len(p), t) for p, t in zip(prompts, tables)], block_size, CPU, False)
    ids = [tok for p in prompts for tok in p]
    pos = [i for p in prompts for i in range(len(p))]
    seqs = [list(p) for p in prompts]
    with torch.inference_mode():
        model(torch.tensor(ids), torch.tensor(pos), cache, meta)
        for _ in range(12):  # decode: the next token of each is the dense argmax
            meta = build_metadata([(len(q) - 1, 1, t) for q, t in zip(seqs, tables)],
                                  block_size, CPU, False)
            step = model.logits(model(torch.tensor([q[-1] for q in seqs]),
                                      torch.tensor([len(q) - 1 for q in seqs]), cache, meta))
            for i, q in enumerate(seqs):
                ref = dense_logits(model, q)[-1]
                torch.testing.assert_close(step[i], ref, atol=ATOL, rtol=0)
                q.append(int(ref.argmax()))
