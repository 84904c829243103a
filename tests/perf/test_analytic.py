from __future__ import annotations

import pytest

from sloserve.batch import BatchShape
from sloserve.perf.analytic import batch_flops_bytes, roofline_times
from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model

LLAMA3 = get_model("llama-3-8b")


def test_single_decode_at_context_zero_reads_all_weights_once() -> None:
    f, m = batch_flops_bytes(LLAMA3, BatchShape(decodes=(0,)))
    emb_table = LLAMA3.vocab_size * LLAMA3.hidden_size * LLAMA3.dtype_bytes
    weights_read = LLAMA3.weight_bytes - emb_table  # only one embedding row is read
    assert weights_read <= m <= weights_read * 1.001
    # 2 FLOPs per weight (one MAC per parameter for one token), within norms/attention
    assert f == pytest.approx(
        2 * (LLAMA3.num_params - LLAMA3.vocab_size * LLAMA3.hidden_size), rel=1e-3
    )


def test_gqa_divides_kv_cache_read_bytes_by_the_group_factor() -> None:
    mha = get_model("llama-2-7b")
    gqa = get_model("mistral-7b")  # same h, n, L as llama-2-7b; 8 KV heads instead of 32
    few, many = BatchShape(decodes=(1000,)), BatchShape(decodes=(5000,))
    per_ctx_mha = batch_flops_bytes(mha, many)[1] - batch_flops_bytes(mha, few)[1]
    per_ctx_gqa = batch_flops_bytes(gqa, many)[1] - batch_flops_bytes(gqa, few)[1]
    assert per_ctx_mha == pytest.approx(4000 * mha.kv_bytes_per_token)
    assert per_ctx_mha / per_ctx_gqa == pytest.approx(mha.num_heads / gqa.num_kv_heads)


def test_two_chunks_cost_the_same_flops_as_one_prefill_except_one_lm_head_row() -> None:
    whole = batch_flops_bytes(LLAMA3, BatchShape(prefills=((2048, 0),)))[0]
    first = batch_flops_bytes(LLAMA3, BatchShape(prefills=((1024, 0),)))[0]
    second = batch_flops_bytes(LLAMA3, BatchShape(prefills=((1024, 1024),)))[0]
    lm_head_row = 2 * LLAMA3.hidden_size * LLAMA3.vocab_size
    assert first + second - lm_head_row == pytest.approx(whole, rel=1e-12)


def test_prefill_attention_flops_are_causal_over_context_plus_chunk() -> None:
    shape = BatchShape(prefills=((100, 50),))
    base = BatchShape(prefills=((100, 0),))
    # 100 queries each see 50 more keys: 4 * s * n FLOPs per pair per layer
    extra = batch_flops_bytes(LLAMA3, shape)[0] - batch_flops_bytes(LLAMA3, base)[0]
    assert extra == pytest.approx(100 * 50 * 4 * LLAMA3.hidden_size * LLAMA3.num_layers)


def test_tensor_parallel_splits_flops_and_weight_bytes_per_gpu() -> None:
    shape = BatchShape(prefills=((512, 0),), decodes=(100,) * 8)
    f1, m1 = batch_flops_bytes(LLAMA3, shape, tp=1)
    f2, m2 = batch_flops_bytes(LLAMA3, shape, tp=2)
    assert 0.5 * f1 <= f2 < 0.55 * f1
    assert 0.5 * m1 < m2 < 0.6 * m1
    with pytest.raises(ValueError, match="tp"):
        batch_flops_bytes(LLAMA3, shape, tp=3)


def test_roofline_times_divide_by_hardware_peaks() -> None:
    hw = get_hardware("a100")
    shape = BatchShape(prefills=((256, 0),), decodes=(300, 400))
    f, m = batch_flops_bytes(LLAMA3, shape)
    assert roofline_times(LLAMA3, hw, shape) == (m / hw.mem_bandwidth, f / hw.peak_flops)
