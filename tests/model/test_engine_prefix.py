"""``TorchEngine`` reuses the KV of cached prefix blocks that the scheduler's table names."""

from __future__ import annotations

import pytest

from sloserve.batch import BatchPlan, ScheduledItem
from sloserve.kv_prefix import PrefixCachingBlockManager, token_hash_ids
from sloserve.model.engine import TorchEngine
from sloserve.model.sampling import SamplingParams
from sloserve.request import Request

BS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
SHARED = [(7 * i + 3) % 251 for i in range(4 * BS)]  # 4 full blocks in common
A = SHARED + [11, 12, 13]
B = SHARED + [200, 201, 202, 203, 204, 205, 206]


def request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, 0.0, len(tokens), GREEDY.max_tokens,
                   hash_ids=token_hash_ids(tokens, BS), hash_unit=BS)


def run(engine: TorchEngine, kv: PrefixCachingBlockManager, r: Request, tokens: list[int],
        *, use_cache: bool = True) -> list[int]:
    """Serve ``r`` alone as ``Instance`` does: take its hit, prefill the rest, decode."""
    engine.add_request(r.request_id, tokens, GREEDY)
    hit = kv.acquire(r) if use_cache else 0
    if hit:
        engine.start_from_cache(r.request_id, hit)
    done, total, out = hit, len(tokens), list[int]()
    while len(out) < GREEDY.max_tokens:
        n = total - done
        kv.allocate(r.request_id, done + n)
        kv.cache_full_blocks(r, done + n)
        item = ScheduledItem(r.request_id, n, done, is_prefill=not out)
        res = engine.execute(BatchPlan([item]), {r.request_id: kv.block_table(r.request_id)})
        done, total = done + n, total + 1
        out.append(res.tokens[r.request_id])
    kv.free(r.request_id)
    engine.free(r.request_id)
    return out


@pytest.fixture()
def engine() -> TorchEngine:
    return TorchEngine("tiny", num_blocks=32, block_size=BS, seed=0)


def test_a_hit_reuses_the_cached_kv_and_generates_what_a_full_prefill_does(
        engine: TorchEngine) -> None:
    kv = PrefixCachingBlockManager(engine.num_blocks, BS)
    run(engine, kv, request("a", A), A)  # computes and caches the shared blocks, then ends
    b = request("b", B)
    assert kv.lookup(b) == len(SHARED)
    cached = run(engine, kv, b, B)
    assert kv.num_hit_tokens == len(SHARED)
    fresh = TorchEngine("tiny", num_blocks=32, block_size=BS, seed=0)
    full = run(fresh, PrefixCachingBlockManager(32, BS), request("b", B), B, use_cache=False)
    assert cached == full


def test_start_from_cache_takes_whole_blocks_below_the_prompt_only(engine: TorchEngine) -> None:
    engine.add_request("x", A, GREEDY)
    with pytest.raises(ValueError, match="num_cached"):
        engine.start_from_cache("x", BS + 1)
    with pytest.raises(ValueError, match="num_cached"):
        engine.start_from_cache("x", len(A) + 5)
    with pytest.raises(ValueError, match="unknown request"):
        engine.start_from_cache("nope", BS)
