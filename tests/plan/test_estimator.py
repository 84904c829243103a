"""BestServe Estimator (§3.3, Appendices A/B): tables, adapted roofline, Algorithm 1, eq. 8."""

from __future__ import annotations

import pytest

from sloserve.batch import BatchShape
from sloserve.perf.hardware import Hardware
from sloserve.perf.models import get_model
from sloserve.plan.estimator import (
    Efficiency,
    Estimator,
    EstimatorConfig,
    ModuleTime,
    Op,
    accumulate,
    allreduce_time,
    attention_decode_ops,
    mlp_ops,
    op_time,
    rmsnorm_ops,
)

HW = Hardware("test", peak_flops=100e12, mem_bandwidth=1e12, mem_bytes=80e9, interconnect_bw=100e9)
LLAMA2 = get_model("llama-2-7b")  # h = 4096, h0 = 11008, MHA
EFF = Efficiency(0.5, 0.25, 0.5)


def test_mlp_prefill_table_1_worked_values() -> None:
    b, s, h, h0 = 2, 3, 4096, 11008
    ops = {op.name: op for op in mlp_ops(LLAMA2, b * s, t=1)}
    assert ops["gate_proj"].work == 2 * b * s * h * h0
    assert ops["gate_proj"].traffic == 2 * (b * s * (h + h0) + h * h0)
    assert ops["silu"].work == 5 * b * s * h0 and ops["silu"].traffic == 4 * b * s * h0
    assert ops["mul"].work == b * s * h0 and ops["mul"].traffic == 6 * b * s * h0
    assert ops["add"].work == b * s * h and ops["add"].traffic == 4 * b * s * h0
    assert _wq(ops["down_proj"]) == _wq(ops["up_proj"]) == _wq(ops["gate_proj"])


def _wq(op: Op) -> tuple[float | None, float]:
    return op.work, op.traffic


def test_mlp_table_12_divides_every_term_by_tp() -> None:
    one = mlp_ops(LLAMA2, 4096, t=1)
    four = mlp_ops(LLAMA2, 4096, t=4)
    for a, b in zip(one, four, strict=True):
        assert b.work == pytest.approx(a.work / 4) and b.traffic == pytest.approx(a.traffic / 4)


def test_mlp_decode_table_2_has_no_sequence_length() -> None:
    # Table 2 prints mul traffic as 6bsh0; a decode step touches 6bh0 bytes (docs/bestserve.md).
    ops = {op.name: op for op in mlp_ops(LLAMA2, 8, t=1)}
    assert ops["mul"].traffic == 6 * 8 * 11008


def test_rmsnorm_table_6_traffic() -> None:
    b, s, h = 1, 10, 4096
    q = sum(op.traffic for op in rmsnorm_ops(b * s, h))
    assert q == 14 * b * s * h + 12 * b * s + 2 * h


def test_gqa_decode_adds_repeat_kv_only_for_gqa() -> None:
    assert "repeat_kv" not in {op.name for op in attention_decode_ops(LLAMA2, 4, 400, 1)}
    gqa = {op.name: op for op in attention_decode_ops(get_model("llama-3-8b"), 4, 400, 1)}
    assert gqa["repeat_kv"].traffic == 4 * 400 * 4096 * (1 + 8 / 32)
    assert gqa["update"].traffic == 4 * 400 * 4096 * (8 / 32)


def test_adapted_roofline_memory_and_compute_bound() -> None:
    # I* = (e_c/e_m)(S_c/S_m) = 2 * 100 = 200 FLOP/byte
    mem = Op("m", work=1e9, traffic=1e9)  # I = 1 < I*: W / (I e_m S_m) = Q / (e_m S_m)
    assert op_time(mem, HW, EFF, EstimatorConfig()) == pytest.approx(1e9 / (0.25 * 1e12))
    comp = Op("c", work=1e12, traffic=1e9)  # I = 1000 > I*: W / (e_c S_c)
    assert op_time(comp, HW, EFF, EstimatorConfig()) == pytest.approx(1e12 / (0.5 * 100e12))


def test_data_movement_ops_use_kappa_or_memory_rate() -> None:
    op = Op("update", None, 1e9, "kappa_update")
    assert op_time(op, HW, EFF, EstimatorConfig()) == pytest.approx(1e9 / (0.25e12))
    assert op_time(op, HW, EFF, EstimatorConfig(kappa_update=2e9)) == pytest.approx(0.5)


def test_algorithm_1_dispatch_bound_accumulation() -> None:
    # GPU work shorter than dispatch: each module starts when its dispatch finishes.
    mods = tuple(ModuleTime(f"m{i}", dispatch=1.0, compute=0.5, communicate=0.0) for i in range(4))
    assert accumulate(mods, num_layers=3) == pytest.approx(3 * 4.5)


def test_algorithm_1_compute_bound_accumulation_with_communication() -> None:
    mods = (
        ModuleTime("norm", 0.1, 1.0, 0.0),
        ModuleTime("attn", 0.1, 2.0, 0.5),
        ModuleTime("norm", 0.1, 1.0, 0.0),
        ModuleTime("mlp", 0.1, 3.0, 0.5),
    )
    # only the first dispatch is exposed; compute and all-reduces add up
    assert accumulate(mods, num_layers=2) == pytest.approx(2 * (0.1 + 7.0 + 1.0))


def test_eq_8_allreduce_with_floor() -> None:
    cfg = EstimatorConfig(allreduce_floor=0.0)
    n, h, t = 2048, 8192, 4
    assert allreduce_time(n, h, t, HW, EFF, cfg) == pytest.approx(n * h / t / (0.5 * 100e9))
    assert allreduce_time(1, h, t, HW, EFF, EstimatorConfig()) == pytest.approx(0.1e-3)
    assert allreduce_time(n, h, 1, HW, EFF, cfg) == 0.0


def test_paper_default_efficiencies() -> None:
    cfg = EstimatorConfig()
    assert (cfg.prefill.e_c, cfg.prefill.e_m, cfg.prefill.e_plus) == (0.65, 0.6, 0.6)
    assert (cfg.decode.e_c, cfg.decode.e_m, cfg.decode.e_plus) == (0.65, 0.3, 0.3)


def test_efficiency_out_of_range_names_the_field() -> None:
    with pytest.raises(ValueError, match="e_m"):
        Efficiency(0.5, 1.5, 0.5)


def test_batch_shape_matches_uniform_oracle() -> None:
    est = Estimator(LLAMA2, HW, tp=2)
    prefill = BatchShape(prefills=((512, 0),) * 3)
    assert est.batch_time(prefill) == pytest.approx(est.estimate_time(3, 512, 0, "prefill"))
    decode = BatchShape(decodes=(700,) * 5)
    assert est.batch_time(decode) == pytest.approx(est.estimate_time(5, 600, 100, "decode"))


def test_chunked_prefill_pays_attention_over_cached_context() -> None:
    est = Estimator(LLAMA2, HW)
    fresh = est.batch_time(BatchShape(prefills=((512, 0),)))
    late = est.batch_time(BatchShape(prefills=((512, 3000),)))
    assert late > fresh


def test_tensor_parallel_shortens_prefill() -> None:
    t1 = Estimator(LLAMA2, HW, tp=1).estimate_time(1, 4096, 0, "prefill")
    t4 = Estimator(LLAMA2, HW, tp=4).estimate_time(1, 4096, 0, "prefill")
    assert t4 < t1 / 2


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="tp"):
        Estimator(LLAMA2, HW, tp=3)
