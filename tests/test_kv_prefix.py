"""Prefix caching: shared full blocks keep their invariants, hits are counted and reused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.kv_prefix import PREFIX_UNIT, PrefixCachingBlockManager, unit_block_hashes
from sloserve.request import Request

BS = 16
PER_UNIT = PREFIX_UNIT // BS


def make(rid: str, prompt: int, output: int = 4, ids: tuple[int, ...] | None = None) -> Request:
    return Request(rid, 0.0, prompt, output, hash_ids=ids)


def admit(kv: PrefixCachingBlockManager, r: Request, tokens: int) -> int:
    """Admit ``r`` as ``Instance.schedule`` does: take its hit, grow, cache full blocks."""
    hit = kv.acquire(r)
    kv.allocate(r.request_id, tokens)
    kv.cache_full_blocks(r, tokens)
    return hit


def check_invariants(kv: PrefixCachingBlockManager) -> None:
    holders: dict[int, int] = {}
    for rid in kv.holders():
        for b in kv.block_table(rid):
            holders[b] = holders.get(b, 0) + 1
    free = set(kv._free)
    evictable = set(kv._evictable)
    for b in range(kv.num_blocks):
        ref = kv.ref_count(b)
        assert ref >= 0, "a reference count went negative"
        assert ref == holders.get(b, 0), "a reference count disagrees with the block tables"
        if ref:  # a referenced block is neither free nor evictable, and keeps its content
            assert b not in free and b not in evictable
            h = kv._hash_of[b]
            assert h is None or kv._cached.get(h) == b
        else:
            assert (b in free) != (b in evictable), "an unreferenced block is lost or doubled"
    for b in evictable:
        assert kv._hash_of[b] is not None, "only cached blocks wait for eviction"
    assert len(free) + len(evictable) + len(holders) == kv.num_blocks, "over-allocation"
    for h, b in kv._cached.items():
        assert kv._hash_of[b] == h


# a few conversations' prefixes: requests share their leading ids
PREFIXES = [(1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 9, 10), (1, 11, 12, 13)]
ops = st.lists(
    st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 5),
              st.integers(0, len(PREFIXES) - 1), st.integers(1, 4 * PREFIX_UNIT - 1)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(8, 200), ops=ops)
def test_sharing_never_breaks_reference_counts_or_frees_a_held_block(
    num_blocks: int, ops: list[tuple[str, int, int, int]]
) -> None:
    kv = PrefixCachingBlockManager(num_blocks, BS)
    reqs: dict[str, Request] = {}  # admitted
    waiting: dict[str, Request] = {}  # looked up (maybe again and again), not admitted
    tokens: dict[str, int] = {}
    for op, n, p, length in ops:
        rid = f"r{n}"
        if op == "admit" and rid not in reqs:
            r = waiting.setdefault(rid, make(rid, length, output=64, ids=PREFIXES[p]))
            hit = kv.lookup(r)
            fresh = 0  # the longest cached run, walked from scratch (no memo)
            for h in unit_block_hashes(r.hash_ids or (), BS, (r.prompt_len - 1) // BS):
                if h not in kv._cached:
                    break
                fresh += BS
            assert hit == fresh, "a memoised lookup disagrees with the cache"
            if kv.blocks_needed(rid, r.prompt_len) > kv.num_free_blocks:
                continue  # admission control (conservative: hits counted as needed)
            evict_before = {b: kv._hash_of[b] for b in range(num_blocks) if kv.ref_count(b)}
            assert admit(kv, r, r.prompt_len) == hit
            table = kv.block_table(rid)
            assert [kv._hash_of[b] for b in table[:hit // BS]] == (
                unit_block_hashes(r.hash_ids or (), BS, hit // BS)), "a hit reuses other content"
            for b, held in evict_before.items():  # eviction took only unreferenced blocks
                assert kv._hash_of[b] == held
            reqs[rid], tokens[rid] = waiting.pop(rid), r.prompt_len
        elif op == "grow" and rid in reqs:
            total = min(tokens[rid] + length // 8 + 1, reqs[rid].prompt_len + 64)
            if kv.can_allocate(rid, total):
                kv.allocate(rid, total)
                kv.cache_full_blocks(reqs[rid], total)
                tokens[rid] = total
        elif op == "free" and rid in reqs:
            kv.free(rid)
            del reqs[rid], tokens[rid]
        elif op == "free" and rid in waiting:  # it leaves before admission
            kv.free(rid)
            del waiting[rid]
        check_invariants(kv)


def test_second_request_with_the_same_prefix_hits_its_full_blocks_only() -> None:
    kv = PrefixCachingBlockManager(100, BS)
    a = make("a", PREFIX_UNIT + 40, ids=(1, 2))
    assert admit(kv, a, a.prompt_len) == 0
    b = make("b", PREFIX_UNIT + 100, ids=(1, 2))
    # a cached 34 full blocks (552 tokens); b may reuse them all (552 < 611)
    assert kv.lookup(b) == (PREFIX_UNIT + 40) // BS * BS
    assert admit(kv, b, b.prompt_len) == (PREFIX_UNIT + 40) // BS * BS
    assert kv.num_query_tokens == a.prompt_len + b.prompt_len
    assert kv.num_hit_tokens == (PREFIX_UNIT + 40) // BS * BS
    shared = kv.block_table("a")[:(PREFIX_UNIT + 40) // BS]
    assert kv.block_table("b")[:len(shared)] == shared
    assert all(kv.ref_count(blk) == 2 for blk in shared)


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    kv = PrefixCachingBlockManager(100, BS)
    admit(kv, make("a", 2 * BS + 1, ids=(9,)), 2 * BS + 1)
    same = make("b", 2 * BS, ids=(9,))  # its whole prompt is two cached blocks
    assert kv.lookup(same) == BS  # capped at prompt_len - 1, in full blocks


def test_different_content_or_no_identity_shares_nothing() -> None:
    kv = PrefixCachingBlockManager(100, BS)
    admit(kv, make("a", 600, ids=(1, 2)), 600)
    assert kv.lookup(make("b", 600, ids=(3, 2))) == 0
    assert kv.lookup(make("c", 600)) == 0


def test_freed_cached_blocks_are_evicted_least_recently_used_tail_first() -> None:
    kv = PrefixCachingBlockManager(4, BS)
    admit(kv, make("a", 2 * BS, ids=(1,)), 2 * BS)
    admit(kv, make("b", 2 * BS, ids=(2,)), 2 * BS)
    a_blocks, b_blocks = kv.block_table("a"), kv.block_table("b")
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 4 and kv.num_cached_blocks == 4
    kv.allocate("c", BS)  # evicts a's tail block: a is least recently used
    assert kv.block_table("c") == [a_blocks[1]]
    assert kv.lookup(make("a2", 3 * BS, ids=(1,))) == BS  # a's head block still hits
    assert kv.lookup(make("b2", 3 * BS, ids=(2,))) == 2 * BS
    assert kv.num_evictions == 1
    kv.allocate("c", 4 * BS)
    assert set(kv.block_table("c")) == set(a_blocks + b_blocks)
    with pytest.raises(MemoryError):
        kv.allocate("c", 5 * BS)


def test_a_referenced_block_is_not_evicted_and_freed_only_by_its_last_holder() -> None:
    kv = PrefixCachingBlockManager(4, BS)
    admit(kv, make("a", 2 * BS + 1, ids=(1,)), 2 * BS + 1)
    admit(kv, make("b", 2 * BS + 1, ids=(1,)), 2 * BS + 1)  # shares a's 2 blocks, 1 own
    assert kv.num_free_blocks == 0
    assert kv.num_reclaimable("a") == 1  # only its own tail block would come back
    kv.free("a")
    assert kv.num_free_blocks == 1
    assert all(kv.ref_count(blk) == 1 for blk in kv.block_table("b"))
    with pytest.raises(MemoryError):
        kv.allocate("c", 2 * BS)
    kv.free("b")
    assert kv.num_free_blocks == 4


def test_unit_hashes_name_blocks_that_straddle_units_by_both_ids() -> None:
    one = unit_block_hashes((1, 2), 48, 30)
    other = unit_block_hashes((1, 3), 48, 30)
    straddle = PREFIX_UNIT // 48  # block 10 covers tokens 480..527: units 0 and 1
    assert one[:straddle] == other[:straddle]
    assert one[straddle] != other[straddle]
    assert len(one) == 2 * PREFIX_UNIT // 48  # only blocks the ids cover


def test_a_waiting_requests_hit_shrinks_when_its_blocks_are_evicted() -> None:
    kv = PrefixCachingBlockManager(4, BS)
    admit(kv, make("a", 2 * BS + 1, ids=(1,)), 2 * BS + 1)
    kv.free("a")
    w = make("w", 3 * BS, ids=(1,))
    assert kv.lookup(w) == 2 * BS
    kv.allocate("c", 3 * BS)  # the two free blocks, then a's tail block
    assert kv.lookup(w) == BS
    kv.allocate("c", 4 * BS)  # and a's head block
    assert kv.lookup(w) == 0
    kv.free("c")
    admit(kv, make("a2", 2 * BS + 1, ids=(1,)), 2 * BS + 1)
    assert kv.lookup(w) == 2 * BS  # cached again: the memo follows the cache up too


def test_a_request_with_a_bad_hash_unit_is_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match="hash_unit"):
        Request("r", 0.0, 10, 2, hash_ids=(1,), hash_unit=0)


@pytest.mark.parametrize("cache_outputs", [True, False])
def test_an_answers_blocks_are_found_again_only_when_outputs_are_cached(
        cache_outputs: bool) -> None:
    """Turn 2 of a chat resends turn 1's prompt and answer. vLLM (the simulator's default)
    names the blocks turn 1's answer fills, so turn 2 finds them; the live stack names a
    request by its prompt's token ids only (``cache_outputs=False``), so turn 2 finds turn
    1's prompt and recomputes its answer (docs/serve.md, "Prefix caching")."""
    kv = PrefixCachingBlockManager(num_blocks=64, block_size=BS, cache_outputs=cache_outputs)
    prompt, answer = PREFIX_UNIT, PREFIX_UNIT  # one unit each: ids (1,) and (2,)
    turn1 = make("t1", prompt, answer, ids=(1, 2))
    admit(kv, turn1, prompt)
    for n in range(prompt + 1, prompt + answer + 1):  # decode the whole answer
        kv.allocate(turn1.request_id, n)
        kv.cache_full_blocks(turn1, n)
    kv.free(turn1.request_id)
    turn2 = make("t2", prompt + answer + 100, 4, ids=(1, 2, 3))
    assert kv.lookup(turn2) == (prompt + answer if cache_outputs else prompt)
    check_invariants(kv)
