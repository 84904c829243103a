"""Paged attention for mixed batches (Sarathi-Serve §4: chunked prefills + decodes in one pass).

New tokens' K/V are scattered into the paged cache by ``slot_mapping``; each
sequence then attends over all its keys (earlier context + its own chunk,
causally, bottom-right aligned). On CUDA with ``flash_attn`` importable the
packed keys go to ``flash_attn_varlen_func``; otherwise PyTorch SDPA runs one
call per multi-token chunk and one padded call for all single-token queries
(decodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sloserve.model.kv_cache import token_slots

try:  # pragma: no cover - only on CUDA machines with flash-attn installed
    from flash_attn import flash_attn_varlen_func
except ImportError:  # pragma: no cover
    flash_attn_varlen_func = None


@dataclass(slots=True)
class AttentionMetadata:
    """Index tensors shared by every layer of one forward pass."""

    query_lens: list[int]
    context_lens: list[int]
    slot_mapping: torch.Tensor  # [T] slot of each new token
    key_slots: torch.Tensor  # [sum(seq_lens)] every slot each sequence reads, packed
    cu_seqlens_q: torch.Tensor  # [n+1] int32
    cu_seqlens_k: torch.Tensor  # [n+1] int32
    max_seqlen_q: int
    max_seqlen_k: int
    chunk_masks: list[torch.Tensor | None]  # per multi-token sequence: None = plain causal
    single_rows: torch.Tensor  # [n1] token index of each single-token query
    single_key_slots: torch.Tensor  # [n1, max_len] (padding -> slot 0)
    single_mask: torch.Tensor  # [n1, 1, 1, max_len] True = attend
    use_flash: bool


def build_metadata(
    seqs: list[tuple[int, int, list[int]]], block_size: int, device: torch.device, use_flash: bool
) -> AttentionMetadata:
    """``seqs``: ``(context_len, query_len, block_table)`` per sequence, in token order."""
    query_lens = [q for _, q, _ in seqs]
    context_lens = [c for c, _, _ in seqs]
    seq_lens = [c + q for c, q, _ in seqs]
    key_slots = [token_slots(bt, 0, c + q, block_size) for c, q, bt in seqs]
    slot_mapping = torch.cat([ks[c:] for ks, c in zip(key_slots, context_lens)])
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    chunk_masks: list[torch.Tensor | None] = []
    single_idx: list[int] = []
    single_keys: list[torch.Tensor] = []
    for i, (c, q, _) in enumerate(seqs):
        if q == 1:
            single_idx.append(starts[i])
            single_keys.append(key_slots[i])
        elif c == 0:
            chunk_masks.append(None)
        else:  # query j (position c+j) sees keys 0..c+j
            mask = torch.arange(c + q)[None, :] <= (c + torch.arange(q))[:, None]
            chunk_masks.append(mask.to(device))
    max_len = max((len(k) for k in single_keys), default=0)
    padded = torch.zeros(len(single_keys), max_len, dtype=torch.long)
    valid = torch.zeros(len(single_keys), max_len, dtype=torch.bool)
    for i, ks in enumerate(single_keys):
        padded[i, : len(ks)] = ks
        valid[i, : len(ks)] = True
    cu_k = torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        query_lens=query_lens,
        context_lens=context_lens,
        slot_mapping=slot_mapping.to(device),
        key_slots=torch.cat(key_slots).to(device),
        cu_seqlens_q=torch.tensor(starts, dtype=torch.int32, device=device),
        cu_seqlens_k=cu_k.to(device),
        max_seqlen_q=max(query_lens),
        max_seqlen_k=max(seq_lens),
        chunk_masks=chunk_masks,
        single_rows=torch.tensor(single_idx, dtype=torch.long, device=device),
        single_key_slots=padded.to(device),
        single_mask=valid[:, None, None, :].to(device),
        use_flash=use_flash,
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

    ``k_cache``/``v_cache`` are the layer's flat slot views, written in place.
    """
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    if meta.use_flash:  # pragma: no cover - CUDA + flash-attn only
        return flash_attn_varlen_func(
            q, k_cache[meta.key_slots], v_cache[meta.key_slots],
            meta.cu_seqlens_q, meta.cu_seqlens_k, meta.max_seqlen_q, meta.max_seqlen_k,
            softmax_scale=scale, causal=True,
        )
    out = torch.empty_like(q)
    gqa = q.shape[1] != k.shape[1]
    chunk = q0 = k0 = 0
    for qlen, ctx in zip(meta.query_lens, meta.context_lens):
        q0, k0 = q0 + qlen, k0 + ctx + qlen
        if qlen == 1:
            continue
        slots = meta.key_slots[k0 - ctx - qlen : k0]
        mask = meta.chunk_masks[chunk]
        chunk += 1
        o = F.scaled_dot_product_attention(
            q[q0 - qlen : q0].transpose(0, 1),
            k_cache[slots].transpose(0, 1),
            v_cache[slots].transpose(0, 1),
            attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=gqa,
        )
        out[q0 - qlen : q0] = o.transpose(0, 1)
    if len(meta.single_rows):
        o = F.scaled_dot_product_attention(
            q[meta.single_rows].unsqueeze(2),  # [n1, H, 1, d]
            k_cache[meta.single_key_slots].transpose(1, 2),  # [n1, KVH, L, d]
            v_cache[meta.single_key_slots].transpose(1, 2),
            attn_mask=meta.single_mask, scale=scale, enable_gqa=gqa,
        )
        out[meta.single_rows] = o.squeeze(2)
    return out
