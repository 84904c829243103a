"""Chunked prefill (Sarathi-Serve §4.1): any chunking gives the logits of one full prefill.

Tolerance: float32, atol 1e-4 on logits of magnitude ~1 (observed ~1e-6).
"""

from __future__ import annotations

import random

import pytest
import torch

from sloserve.model.attention import build_metadata
from sloserve.model.config import get_config
from sloserve.model.kv_cache import PagedKVCache
from sloserve.model.llama import LlamaModel

ATOL = 1e-4
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    m = LlamaModel(get_config("tiny"))
    m.init_random(0)
    return m.eval()


def new_cache(model: LlamaModel, num_blocks: int = 64, block_size: int = 4) -> PagedKVCache:
    s = model.cfg.shape
    return PagedKVCache(s.num_layers, num_blocks, block_size, s.num_kv_heads, model.cfg.head_dim,
                        torch.float32, CPU)


def run(
    model: LlamaModel,
    cache: PagedKVCache,
    seqs: list[tuple[list[int], int, int, list[int]]],
) -> list[torch.Tensor]:
    """One forward over ``(token_ids, context_len, num_tokens, block_table)``; logits per seq."""
    ids: list[int] = []
    pos: list[int] = []
    meta_seqs: list[tuple[int, int, list[int]]] = []
    for tokens, ctx, n, table in seqs:
        ids += tokens[ctx : ctx + n]
        pos += range(ctx, ctx + n)
        meta_seqs.append((ctx, n, table))
    meta = build_metadata(meta_seqs, cache.block_size, CPU, use_flash=False)
    with torch.inference_mode():
        logits = model.logits(model(torch.tensor(ids), torch.tensor(pos), cache, meta))
    return list(logits.split([n for _, _, n, _ in seqs]))


def test_any_chunking_of_a_prefill_gives_the_full_prefill_logits(model: LlamaModel) -> None:
    rng = random.Random(0)
    tokens = [rng.randrange(512) for _ in range(45)]
    table = rng.sample(range(64), 12)  # scattered, non-contiguous blocks of 4 tokens
    (full,) = run(model, new_cache(model), [(tokens, 0, 45, table)])
    for chunking in ([1] * 45, [16, 16, 13], [3, 40, 2], [44, 1]):
        cache = new_cache(model)
        parts, ctx = [], 0
        for n in chunking:
            parts += run(model, cache, [(tokens, ctx, n, table)])
            ctx += n
        torch.testing.assert_close(torch.cat(parts), full, atol=ATOL, rtol=0)


def test_mixed_batch_matches_each_sequence_run_alone(model: LlamaModel) -> None:
    """Two prefill chunks (one over earlier context) and two decodes in one forward."""
    rng = random.Random(1)
    seqs = [[rng.randrange(512) for _ in range(n)] for n in (30, 21, 9, 17)]
    tables = [list(range(i * 16, i * 16 + 16))[::-1] for i in range(4)]
    # (context already cached, tokens in this step)
    steps = [(10, 20), (0, 21), (8, 1), (16, 1)]
    alone = []
    cache = new_cache(model)
    for tokens, table, (ctx, n) in zip(seqs, tables, steps):
        if ctx:
            run(model, cache, [(tokens, 0, ctx, table)])
        alone += run(model, cache, [(tokens, ctx, n, table)])
    cache = new_cache(model)
    for tokens, table, (ctx, _) in zip(seqs, tables, steps):
        if ctx:
            run(model, cache, [(tokens, 0, ctx, table)])
    mixed = run(model, cache, [(t, c, n, tb) for t, tb, (c, n) in zip(seqs, tables, steps)])
    for a, b in zip(alone, mixed):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
