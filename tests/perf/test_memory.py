from __future__ import annotations

import pytest

from sloserve.perf.hardware import get_hardware
from sloserve.perf.memory import kv_capacity_blocks
from sloserve.perf.models import get_model


def test_llama3_8b_on_a100_worked_example() -> None:
    model, hw = get_model("llama-3-8b"), get_hardware("a100")
    # 80e9 * 0.9 - 16_060_522_496 B weights - 1 GiB = 54_865_735_680 B free;
    # one block = 16 tokens * 131_072 B (2 * 32 layers * 1024 * 2 B) = 2_097_152 B
    assert model.weight_bytes == 16_060_522_496
    assert model.kv_bytes_per_token == 131_072
    assert kv_capacity_blocks(model, hw, activation_reserve_bytes=2**30) == 26_162


def test_tensor_parallel_shards_weights_and_kv() -> None:
    model, hw = get_model("llama-2-70b"), get_hardware("a100")
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity_blocks(model, hw)
    assert kv_capacity_blocks(model, hw, tp=4) > 8 * kv_capacity_blocks(model, hw, tp=2)


def test_bad_arguments_name_the_field() -> None:
    model, hw = get_model("llama-3-8b"), get_hardware("a100")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_capacity_blocks(model, hw, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="block_size"):
        kv_capacity_blocks(model, hw, block_size=0)
