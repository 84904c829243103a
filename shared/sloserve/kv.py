"""Paged KV block manager (vLLM's PagedAttention bookkeeping, no tensors).

A request holding ``c`` computed tokens owns ``ceil(c / block_size)`` blocks.
Allocation happens per prefill chunk and per decode token; blocks are freed on
finish or preemption. It never hands out more blocks than it has.
"""

from __future__ import annotations


def check_geometry(num_blocks: int, block_size: int) -> None:
    """A KV cache's shape, checked the same way wherever one is built."""
    if num_blocks < 1:
        raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")


class BlockManager:
    prefix_caching = False  # True in ``sloserve.kv_prefix.PrefixCachingBlockManager``

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        check_geometry(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def utilization(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def blocks_needed(self, request_id: str, total_tokens: int) -> int:
        """Extra blocks needed for ``request_id`` to hold ``total_tokens`` tokens."""
        table = self._tables.get(request_id)
        need = -(-total_tokens // self.block_size) - (len(table) if table else 0)
        return need if need > 0 else 0

    def can_allocate(self, request_id: str, total_tokens: int) -> bool:
        return self.blocks_needed(request_id, total_tokens) <= len(self._free)

    def allocate(self, request_id: str, total_tokens: int) -> list[int]:
        """Grow ``request_id``'s table to hold ``total_tokens``; returns new block ids."""
        need = self.blocks_needed(request_id, total_tokens)
        if need > len(self._free):
            raise MemoryError(
                f"kv: request {request_id} needs {need} blocks, only {len(self._free)} free"
            )
        if not need:
            return []
        free = self._free
        new = free[-need:]  # the last ``need`` free blocks, in the order ``pop`` takes them
        del free[-need:]
        new.reverse()
        self._tables.setdefault(request_id, []).extend(new)
        return new

    def grow_each(self, request_ids: list[str]) -> None:
        """One more block for each of ``request_ids``, in order (decodes that each crossed a
        block boundary: ``allocate(rid, c + 1)`` with ``c`` a multiple of the block size)."""
        if len(request_ids) > len(self._free):
            raise MemoryError(f"kv: {len(request_ids)} blocks needed, "
                              f"only {len(self._free)} free")
        pop, tables = self._free.pop, self._tables
        for rid in request_ids:
            tables[rid].append(pop())

    def free(self, request_id: str) -> int:
        blocks = self._tables.pop(request_id, [])
        self._free.extend(reversed(blocks))
        return len(blocks)

    def num_reclaimable(self, request_id: str) -> int:
        """Blocks that freeing ``request_id`` would return to the pool (all of its own)."""
        return len(self._tables.get(request_id, ()))

    def block_table(self, request_id: str) -> list[int]:
        return list(self._tables.get(request_id, ()))

    def blocks_from(self, request_id: str, start: int) -> list[int]:
        """``request_id``'s blocks from index ``start`` on (tables only grow until freed:
        the blocks appended since a reader last saw ``start`` of them)."""
        table = self._tables.get(request_id)
        return table[start:] if table else []

    def holders(self) -> list[str]:
        return list(self._tables)
