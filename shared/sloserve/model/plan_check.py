"""The checks every engine makes on a plan before running it (torch and vLLM backends)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class Progress(Protocol):
    """What an engine knows of a sequence: its token ids and how many have KV."""

    token_ids: list[int]
    num_computed: int


def check_plan(
    items: Sequence[tuple[str, int, int]], seqs: Mapping[str, Progress],
    tables: Mapping[str, Sequence[int]], block_size: int, num_blocks: int,
    max_tokens: int, max_seqs: int | None = None,
) -> None:
    """``items``: (request id, context_len, num_tokens). Raises ``ValueError`` naming what is
    wrong: too many tokens or sequences, an unknown or repeated request, a chunk that does
    not continue the sequence, or a block table that is too short or out of range."""
    total = sum(n for _, _, n in items)
    if total > max_tokens:
        raise ValueError(f"plan: {total} tokens exceed max_num_batched_tokens {max_tokens}")
    if max_seqs is not None and len(items) > max_seqs:
        raise ValueError(f"plan: {len(items)} sequences exceed max_num_seqs {max_seqs}")
    seen: set[str] = set()
    for rid, context_len, num_tokens in items:
        seq = seqs.get(rid)
        if seq is None:
            raise ValueError(f"plan: unknown request {rid!r} (never added)")
        if rid in seen:
            raise ValueError(f"plan: request {rid!r} scheduled twice")
        seen.add(rid)
        end = context_len + num_tokens
        if num_tokens < 1 or context_len != seq.num_computed or end > len(seq.token_ids):
            raise ValueError(
                f"plan: item {rid} (context_len {context_len}, num_tokens {num_tokens}) "
                f"inconsistent with the request (computed {seq.num_computed} of "
                f"{len(seq.token_ids)} tokens)")
        table = tables.get(rid, ())
        if len(table) * block_size < end:
            raise ValueError(f"block_table: request {rid} needs {-(-end // block_size)} blocks, "
                             f"got {len(table)}")
        if any(not 0 <= b < num_blocks for b in table):
            raise ValueError(f"block_table: request {rid} has a block id outside "
                             f"[0, {num_blocks})")
