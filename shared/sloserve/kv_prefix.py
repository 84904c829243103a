"""Automatic prefix caching on the paged KV manager (vLLM V1 ``KVCacheManager``, no tensors).

A *full* block's content is named by a chained hash, ``hash(parent hash, the
block's content)``, so equal hashes mean equal prefixes. Full blocks are
registered in a hash -> block map; a new request reuses the longest run of
cached blocks at the start of its token stream and starts its prefill at the
first uncached token (``num_computed`` = the hit, as vLLM's
``num_computed_tokens``). Blocks carry reference counts: a shared block is
freed only when its last holder lets go, and then stays cached, *evictable*,
in LRU order (a request's tail blocks first, as vLLM appends freed blocks in
reverse); allocation takes never-cached blocks first, then evicts the least
recently used unreferenced cached block. Only full blocks are cached, and a
hit is capped at ``prompt_len - 1`` tokens so at least one token is computed
(it yields the first output token's logits).

Content without token ids (simulation, Mooncake traces) comes from the
request's ``hash_ids``: one id per ``PREFIX_UNIT`` = 512 tokens of its token
stream; our block ``b`` is named by the ids of the units it overlaps and its
offset. The live stack names units by real token ids instead (``token_hash_ids``, one
unit per KV block).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sloserve.kv import BlockManager
from sloserve.request import Request

PREFIX_UNIT = 512  # tokens per hash id (Mooncake traces)
_ROOT = 0x5105E  # parent hash of a stream's first block


def unit_block_hashes(hash_ids: Sequence[int], block_size: int, num_blocks: int,
                      unit: int = PREFIX_UNIT) -> list[int]:
    """Chained hashes of the first ``num_blocks`` full blocks named by ``hash_ids``
    (fewer when the ids cover fewer blocks)."""
    out: list[int] = []
    parent = _ROOT
    covered = len(hash_ids) * unit
    for b in range(num_blocks):
        start, end = b * block_size, (b + 1) * block_size
        if end > covered:
            break
        lo, hi = start // unit, (end - 1) // unit
        key: object = hash_ids[lo] if lo == hi else tuple(hash_ids[lo:hi + 1])
        parent = hash((parent, key, start % unit))
        out.append(parent)
    return out


def token_hash_ids(token_ids: Sequence[int], unit: int) -> tuple[int, ...]:
    """Prefix identity from real token ids (the live stack): one id per ``unit`` tokens,
    vLLM's chained block hash ``hash(parent, tokens of the unit)``; give the request
    ``hash_unit=unit`` (the KV block size, so every full block can be shared)."""
    if unit < 1:
        raise ValueError(f"unit: must be >= 1, got {unit}")
    out, parent = [], _ROOT
    for start in range(0, len(token_ids), unit):
        parent = hash((parent, tuple(token_ids[start:start + unit])))
        out.append(parent)
    return tuple(out)


class PrefixCachingBlockManager(BlockManager):
    """``BlockManager`` whose full blocks are content-hashed, shared and LRU-evicted."""

    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, cache_outputs: bool = True) -> None:
        """``cache_outputs``: the blocks a request's output fills are named and shared too
        (vLLM's; the simulator's default). False names only its prompt's full blocks, as the
        live stack does: its requests' identity is their prompt's token ids
        (``token_hash_ids``), so a block its answer fills is never found again."""
        super().__init__(num_blocks, block_size)
        self.cache_outputs = cache_outputs
        self._ref = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, cached; LRU first
        self._stream: dict[str, tuple[tuple[int, ...], list[int]]] = {}  # rid -> (ids, hashes)
        self._registered: dict[str, int] = {}  # request -> leading blocks already registered
        self._lookups: dict[str, tuple[int, int]] = {}  # request -> (evictions then, hit blocks)
        self.num_query_tokens = 0  # prompt tokens looked up at admission (vLLM "queries")
        self.num_hit_tokens = 0  # of which found cached ("hits")
        self.num_evictions = 0

    # --- pool -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: never-cached free ones and evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Referenced blocks (vLLM's KV usage: evictable cached blocks count as free)."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def _take_block(self) -> int:
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._evictable.popitem(last=False)  # least recently used
            h = self._hash_of[block]
            if h is not None and self._cached.get(h) == block:
                del self._cached[h]
            self._hash_of[block] = None
            self.num_evictions += 1
        self._ref[block] = 1
        return block

    def allocate(self, request_id: str, total_tokens: int) -> list[int]:
        need = self.blocks_needed(request_id, total_tokens)
        free = self.num_free_blocks
        if need > free:
            raise MemoryError(f"kv: request {request_id} needs {need} blocks, only {free} free")
        if not need:
            return []
        new = [self._take_block() for _ in range(need)]
        self._tables.setdefault(request_id, []).extend(new)
        return new

    def grow_each(self, request_ids: list[str]) -> None:
        for rid in request_ids:  # through ``allocate``: free blocks may be evicted cache
            self.allocate(rid, self.num_blocks_of(rid) * self.block_size + 1)

    def free(self, request_id: str) -> int:
        blocks = self._tables.pop(request_id, [])
        self._stream.pop(request_id, None)
        self._registered.pop(request_id, None)
        self._lookups.pop(request_id, None)
        ref, hash_of = self._ref, self._hash_of
        for block in reversed(blocks):  # the tail is evicted before the head
            if ref[block] < 1:
                raise AssertionError(f"kv: block {block} freed with reference count {ref[block]}")
            ref[block] -= 1
            if ref[block] == 0:
                if hash_of[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        return len(blocks)

    def num_reclaimable(self, request_id: str) -> int:
        ref = self._ref
        return sum(1 for b in self._tables.get(request_id, ()) if ref[b] == 1)

    # --- prefix lookups -------------------------------------------------------------
    def _hashes(self, req: Request) -> list[int]:
        """``req``'s block hashes, memoised while its ``hash_ids`` are the same object."""
        ids = req.hash_ids
        assert ids is not None
        memo = self._stream.get(req.request_id)
        if memo is not None and memo[0] is ids:
            return memo[1]
        n = (req.prompt_len + (req.output_len if self.cache_outputs else 0)) // self.block_size
        hashes = unit_block_hashes(ids, self.block_size, n, req.hash_unit)
        self._stream[req.request_id] = (ids, hashes)
        self._lookups.pop(req.request_id, None)
        return hashes

    def lookup(self, req: Request) -> int:
        """Cached prompt tokens at the start of ``req`` (full blocks, at most
        ``prompt_len - 1``); looks only, holds nothing. Memoised per request: while
        nothing was evicted the cache only grew, so the walk resumes where it stopped."""
        if req.hash_ids is None:
            return 0
        rid = req.request_id
        limit = (req.prompt_len - 1) // self.block_size
        hashes = self._hashes(req)
        memo = self._lookups.get(rid)
        n = memo[1] if memo is not None and memo[0] == self.num_evictions else 0
        cached = self._cached
        end = min(limit, len(hashes))
        while n < end and hashes[n] in cached:
            n += 1
        self._lookups[rid] = (self.num_evictions, n)
        return n * self.block_size

    def acquire(self, req: Request) -> int:
        """Admit ``req``: take a reference on its cached prefix blocks (the hit found by
        ``lookup`` now) into its table; counts the lookup. Returns the hit in tokens."""
        rid = req.request_id
        if self._tables.get(rid):
            raise ValueError(f"kv: request {rid} already holds blocks")
        hit = self.lookup(req)
        self.num_query_tokens += req.prompt_len
        self.num_hit_tokens += hit
        if hit:
            hashes, ref = self._hashes(req), self._ref
            table = []
            for h in hashes[:hit // self.block_size]:
                block = self._cached[h]
                if ref[block] == 0:
                    del self._evictable[block]
                ref[block] += 1
                table.append(block)
            self._tables[rid] = table
            self._registered[rid] = len(table)
        return hit

    def cache_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Register ``req``'s blocks that are full once it holds ``num_tokens`` tokens
        (vLLM caches at schedule time). A block whose content is already cached
        elsewhere stays a private duplicate, as in vLLM."""
        if req.hash_ids is None:
            return
        rid = req.request_id
        start = self._registered.get(rid, 0)
        if num_tokens // self.block_size <= start:
            return  # no block newly full
        table = self._tables.get(rid)
        if not table:
            return
        hashes = self._hashes(req)
        full = min(num_tokens // self.block_size, len(table), len(hashes))
        cached, hash_of = self._cached, self._hash_of
        for b in range(start, full):
            h, block = hashes[b], table[b]
            if h not in cached and hash_of[block] is None:
                cached[h] = block
                hash_of[block] = h
        # blocks past the identity's coverage never register: do not look at them again
        self._registered[rid] = min(num_tokens // self.block_size, len(table))


def prefix_counts(instances: Sequence[object]) -> dict[str, int]:
    """Prefix-cache counters summed over ``instances`` (``Instance``-like, with a ``kv``);
    {} without prefix caching. Counters of disjoint instance sets add up."""
    kvs = [kv for i in instances if isinstance(kv := getattr(i, "kv", None),
                                                  PrefixCachingBlockManager)]
    if not kvs:
        return {}
    return {
        "prefix_query_tokens": sum(k.num_query_tokens for k in kvs),
        "prefix_hit_tokens": sum(k.num_hit_tokens for k in kvs),
        "prefix_evictions": sum(k.num_evictions for k in kvs),
    }


def prefix_report(counts: dict[str, int]) -> dict[str, float | int]:
    """``prefix_counts`` as a run reports them, with the hit rate; {} without."""
    if not counts:
        return {}
    query, hit = counts["prefix_query_tokens"], counts["prefix_hit_tokens"]
    return {
        "prefix_query_tokens": query,
        "prefix_hit_tokens": hit,
        "prefix_hit_rate": round(hit / query, 4) if query else 0.0,
        "prefix_evictions": counts["prefix_evictions"],
    }


def prefix_stats(instances: Sequence[object]) -> dict[str, float | int]:
    """Prefix-cache totals over ``instances`` (``Instance``-like, with a ``kv``); {} without."""
    return prefix_report(prefix_counts(instances))
