"""KV-cache capacity of one GPU, the way vLLM sizes its block pool.

``blocks = (mem * util - weights/tp - activation_reserve) // (kv_bytes_per_token/tp * block)``
"""

from __future__ import annotations

from sloserve.perf.hardware import Hardware
from sloserve.perf.models import ModelShape

#: Peak activation memory of vLLM's startup profiling run (4096 batched tokens,
#: logits, CUDA graphs) for 7-8B models: 1-3 GiB; 2 GiB is the default here.
ACTIVATION_RESERVE_BYTES = 2 * 1024**3


def kv_capacity_blocks(
    model: ModelShape,
    hw: Hardware,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    tp: int = 1,
    activation_reserve_bytes: float = ACTIVATION_RESERVE_BYTES,
) -> int:
    """KV blocks of ``block_size`` tokens that fit on each of ``tp`` GPUs."""
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization}")
    if tp < 1 or model.num_kv_heads % tp:
        raise ValueError(f"tp: {tp} must be >= 1 and divide num_kv_heads={model.num_kv_heads}")
    if activation_reserve_bytes < 0:
        raise ValueError(f"activation_reserve_bytes: must be >= 0, got {activation_reserve_bytes}")
    free = (
        hw.mem_bytes * gpu_memory_utilization - model.weight_bytes / tp - activation_reserve_bytes
    )
    block_bytes = model.kv_bytes_per_token / tp * block_size
    if free < block_bytes:
        raise ValueError(
            f"model: {model.name!r} ({model.weight_bytes / 1e9:.1f} GB weights, tp={tp}) does not "
            f"fit on {hw.name!r} ({hw.mem_bytes / 1e9:.0f} GB x {gpu_memory_utilization}) "
            f"with room for one KV block"
        )
    return int(free // block_bytes)
