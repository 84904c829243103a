"""The paged KV block manager never over-allocates and frees exactly what it gave."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.kv import BlockManager

ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 7), st.integers(1, 200)),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 64), block_size=st.integers(1, 32), ops=ops)
def test_never_over_allocates_and_blocks_are_unique(num_blocks: int, block_size: int,
                                                    ops: list[tuple[str, int, int]]) -> None:
    kv = BlockManager(num_blocks, block_size)
    held: dict[str, int] = {}  # request -> tokens it holds
    for op, rid_n, tokens in ops:
        rid = f"r{rid_n}"
        if op == "alloc":
            total = held.get(rid, 0) + tokens
            if kv.can_allocate(rid, total):
                kv.allocate(rid, total)
                held[rid] = total
            else:
                before = kv.num_free_blocks
                with pytest.raises(MemoryError):
                    kv.allocate(rid, total)
                assert kv.num_free_blocks == before  # a refused allocation changes nothing
        else:
            kv.free(rid)
            held.pop(rid, None)
        tables = [kv.block_table(r) for r in kv.holders()]
        flat = [b for t in tables for b in t]
        assert len(flat) == len(set(flat)), "a block is owned twice"
        assert all(0 <= b < num_blocks for b in flat)
        assert len(flat) + kv.num_free_blocks == num_blocks
        for r, t in held.items():
            assert kv.num_blocks_of(r) == -(-t // block_size)


def test_blocks_are_added_per_chunk_not_per_prompt() -> None:
    kv = BlockManager(10, 16)
    kv.allocate("a", 16)
    assert kv.num_blocks_of("a") == 1
    kv.allocate("a", 17)  # one more token spills into a second block
    assert kv.num_blocks_of("a") == 2
    assert kv.free("a") == 2
    assert kv.num_free_blocks == 10


def test_bad_sizes_are_rejected_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)


def test_grow_each_is_allocate_one_block_per_request_in_order() -> None:
    a, b = BlockManager(10, 4), BlockManager(10, 4)
    for kv in (a, b):
        kv.allocate("x", 4)
        kv.allocate("y", 8)
    a.grow_each(["y", "x", "y"])
    for rid, tokens in (("y", 9), ("x", 5), ("y", 13)):
        b.allocate(rid, tokens)
    assert a.block_table("x") == b.block_table("x") and a.block_table("y") == b.block_table("y")
    assert a.num_free_blocks == b.num_free_blocks == 4
    with pytest.raises(MemoryError):
        a.grow_each(["x"] * 5)
    assert a.num_free_blocks == 4  # nothing taken


def test_grow_each_of_the_prefix_caching_manager_goes_through_allocate() -> None:
    from sloserve.kv_prefix import PrefixCachingBlockManager

    a, b = PrefixCachingBlockManager(10, 4), PrefixCachingBlockManager(10, 4)
    for kv in (a, b):
        kv.allocate("x", 4)
    a.grow_each(["x", "x"])
    b.allocate("x", 12)
    assert a.block_table("x") == b.block_table("x") and a.num_free_blocks == b.num_free_blocks


def test_blocks_go_out_lowest_first_and_freed_ones_are_reused_first() -> None:
    """Block ids in the order of one ``pop`` per block (the live executor's KV tensors and
    the simulator's written-back steady runs see the same ids)."""
    kv = BlockManager(8, 4)
    assert kv.allocate("a", 9) == [0, 1, 2]
    assert kv.allocate("b", 4) == [3]
    kv.free("a")
    assert kv.allocate("c", 8) == [0, 1]
    assert kv.allocate("c", 13) == [2, 4]
    assert kv.block_table("c") == [0, 1, 2, 4]
