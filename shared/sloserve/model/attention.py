"""Paged attention for mixed batches (Sarathi-Serve §4: chunked prefills + decodes in one pass).

New tokens' K/V are scattered into the paged cache by ``slot_mapping``; each
sequence then attends over all its keys (earlier context + its own chunk,
causally, bottom-right aligned). Keys are gathered whole blocks at a time
through the block tables. On CUDA with ``flash_attn`` importable the packed
keys go to ``flash_attn_varlen_func``; otherwise PyTorch SDPA runs one call
per multi-token chunk and one padded call for all single-token queries
(decodes), with the query heads of a KV group as rows (GQA without copies).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sloserve.model.kv_cache import token_slots

try:  # pragma: no cover - only on CUDA machines with flash-attn installed
    from flash_attn import flash_attn_varlen_func
except ImportError:  # pragma: no cover
    flash_attn_varlen_func = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """A multi-token query run: rows ``[start, start + length)`` over ``seq_len`` keys."""

    start: int
    length: int
    seq_len: int
    blocks: torch.Tensor  # block ids covering the keys
    mask: torch.Tensor | None  # [length, seq_len], None = plain causal (no earlier context)


@dataclass(slots=True)
class AttentionMetadata:
    """Index tensors shared by every layer of one forward pass."""

    slot_mapping: torch.Tensor  # [T] KV slot of each new token
    chunks: list[Chunk]
    single_rows: torch.Tensor  # [n1] token row of each single-token query (decodes)
    single_blocks: torch.Tensor  # [n1, max_blocks] block tables, padded with block 0
    single_mask: torch.Tensor  # [n1, 1, 1, max_blocks * block_size] True = attend
    flash: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None
    # (key_slots packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    gather_buffers: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)

    def gather(
        self, cache: torch.Tensor, blocks: torch.Tensor, key: tuple[str, int]
    ) -> torch.Tensor:
        """``cache[blocks]`` into a buffer reused by every layer (no per-layer allocation)."""
        buf = self.gather_buffers.get(key)
        if buf is None:
            buf = self.gather_buffers[key] = cache.new_empty((blocks.numel(), *cache.shape[1:]))
        return torch.index_select(cache, 0, blocks.reshape(-1), out=buf)


def build_metadata(
    seqs: list[tuple[int, int, list[int]]], block_size: int, device: torch.device, use_flash: bool
) -> AttentionMetadata:
    """``seqs``: ``(context_len, query_len, block_table)`` per sequence, in token order."""
    slots, chunks = [], []
    singles: list[tuple[int, list[int], int]] = []
    start = 0
    for ctx, q, table in seqs:
        seq_len = ctx + q
        slots.append(token_slots(table, ctx, seq_len, block_size))
        used = table[: -(-seq_len // block_size)]
        if q == 1:
            singles.append((start, used, seq_len))
        else:
            mask = None
            if ctx:  # query j (position ctx + j) sees keys 0..ctx + j
                mask = torch.arange(seq_len)[None, :] <= (ctx + torch.arange(q))[:, None]
                mask = mask.to(device)
            chunks.append(Chunk(start, q, seq_len, torch.tensor(used, device=device), mask))
        start += q
    max_blocks = max((len(u) for _, u, _ in singles), default=0)
    blocks = torch.zeros(len(singles), max_blocks, dtype=torch.long)
    lens = torch.tensor([n for _, _, n in singles], dtype=torch.long)
    for i, (_, used, _) in enumerate(singles):
        blocks[i, : len(used)] = torch.tensor(used)
    valid = torch.arange(max_blocks * block_size)[None, :] < lens[:, None]
    flash = None
    if use_flash:  # pragma: no cover - CUDA + flash-attn only
        key_slots = torch.cat([token_slots(t, 0, c + q, block_size) for c, q, t in seqs])
        qlens = torch.tensor([0] + [q for _, q, _ in seqs])
        klens = torch.tensor([0] + [c + q for c, q, _ in seqs])
        flash = (
            key_slots.to(device),
            qlens.cumsum(0).to(device, torch.int32),
            klens.cumsum(0).to(device, torch.int32),
            int(qlens.max()),
            int(klens.max()),
        )
    return AttentionMetadata(
        slot_mapping=torch.cat(slots).to(device),
        chunks=chunks,
        single_rows=torch.tensor([s for s, _, _ in singles], dtype=torch.long, device=device),
        single_blocks=blocks.to(device),
        single_mask=valid[:, None, None, :].to(device),
        flash=flash,
    )


def flash_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        flash_attn_varlen_func is not None
        and device.type == "cuda"
        and dtype in (torch.float16, torch.bfloat16)
    )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """``q`` [T, H, d], ``k``/``v`` [T, KVH, d] for the new tokens; returns [T, H, d].

    ``k_cache``/``v_cache`` are one layer's ``[num_blocks, block_size, KVH, d]``
    tensors, written in place.
    """
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    k_flat, v_flat = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    k_flat.index_copy_(0, meta.slot_mapping, k)
    v_flat.index_copy_(0, meta.slot_mapping, v)
    if meta.flash is not None:  # pragma: no cover - CUDA + flash-attn only
        key_slots, cu_q, cu_k, max_q, max_k = meta.flash
        flash_out: torch.Tensor = flash_attn_varlen_func(
            q, k_flat[key_slots], v_flat[key_slots], cu_q, cu_k, max_q, max_k,
            softmax_scale=scale, causal=True,
        )
        return flash_out
    out = torch.empty_like(q)
    heads = q.shape[1]
    for i, c in enumerate(meta.chunks):
        keys = meta.gather(k_cache, c.blocks, ("k", i)).view(-1, kvh, d)[: c.seq_len]
        values = meta.gather(v_cache, c.blocks, ("v", i)).view(-1, kvh, d)[: c.seq_len]
        o = F.scaled_dot_product_attention(
            q[c.start : c.start + c.length].transpose(0, 1), keys.transpose(0, 1),
            values.transpose(0, 1),
            attn_mask=c.mask, is_causal=c.mask is None, scale=scale, enable_gqa=heads != kvh,
        )
        out[c.start : c.start + c.length] = o.transpose(0, 1)
    n1 = len(meta.single_rows)
    if n1:
        # [n1, KVH, L, d] keys; the query heads of each KV group are the query rows
        keys = meta.gather(k_cache, meta.single_blocks, ("k", -1)).view(n1, -1, kvh, d)
        values = meta.gather(v_cache, meta.single_blocks, ("v", -1)).view(n1, -1, kvh, d)
        o = F.scaled_dot_product_attention(
            q[meta.single_rows].view(n1, kvh, heads // kvh, d), keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=meta.single_mask, scale=scale,
        )
        out[meta.single_rows] = o.reshape(n1, heads, d)
    return out
