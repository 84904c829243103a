"""Paged KV tensors (vLLM PagedAttention), per layer ``[num_blocks, block_size, kv_heads, d]``.

Blocks are handed out by the scheduler's ``sloserve.kv.BlockManager``; this
class only holds the tensors and maps (block table, position) to a slot.
"""

from __future__ import annotations

import torch

from sloserve.kv import check_geometry


def token_slots(block_table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """Flat KV slots (``block * block_size + offset``) of positions ``[start, end)``."""
    pos = torch.arange(start, end)
    table = torch.tensor(block_table, dtype=torch.long)
    return table[pos // block_size] * block_size + pos % block_size


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        check_geometry(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * elem

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s K and V, ``[num_blocks, block_size, kv_heads, head_dim]`` each."""
        return self.k[index], self.v[index]
