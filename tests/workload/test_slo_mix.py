"""SLO mixes: uniform, and AccelGen's heterogeneous mix (§3, §6.1) with JCT requests."""

from __future__ import annotations

import numpy as np
import pytest

from sloserve.batch import BatchShape
from sloserve.perf.linear import LinearPerfModel
from sloserve.request import SLO
from sloserve.workload.generate import make_requests
from sloserve.workload.slo_mix import READING_SPEED_TBT, group_latencies, hetero_slos, uniform_slos
from sloserve.workload.traces import TraceRequest

PERF = LinearPerfModel()


def prefill(p: int) -> float:
    return float(PERF.predict(BatchShape(prefills=((p, 0),))))


def test_uniform_slos_give_every_request_the_same_targets() -> None:
    assert uniform_slos(3, ttft_slo=1.0, tbt_slo=0.1) == [SLO(1.0, 0.1)] * 3
    with pytest.raises(ValueError, match="tbt_slo"):
        uniform_slos(1, ttft_slo=1.0, tbt_slo=-0.1)


def test_group_latency_is_mean_prefill_latency_of_its_512_token_group() -> None:
    lat = group_latencies([100, 300, 600, 511, 512], PERF.predict)
    g0 = (prefill(100) + prefill(300) + prefill(511)) / 3
    g1 = (prefill(600) + prefill(512)) / 2
    assert lat.tolist() == pytest.approx([g0, g0, g1, g0, g1])


def test_hetero_ttft_is_group_latency_times_scale_in_half_to_one_and_a_half() -> None:
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, 4096, size=4000).tolist()
    slos = hetero_slos(prompts, [10] * 4000, rng, batch_time=PERF.predict)
    scale = np.array([s.ttft for s in slos]) / group_latencies(prompts, PERF.predict)
    assert scale.min() >= 0.5 and scale.max() <= 1.5
    assert scale.min() < 0.52 and scale.max() > 1.48  # the whole range is used


def test_hetero_tbt_is_reading_speed_times_scale_in_075_to_125() -> None:
    slos = hetero_slos([10] * 4000, [10] * 4000, np.random.default_rng(1), ttft_slo=1.0)
    tbt = np.array([s.tbt for s in slos])
    assert tbt.min() >= 0.75 * 0.1875 and tbt.max() <= 1.25 * 0.1875
    assert tbt.min() < 0.76 * 0.1875 and tbt.max() > 1.24 * 0.1875
    assert READING_SPEED_TBT == 0.1875


def test_hetero_flags_are_scale_anchors() -> None:
    slos = hetero_slos([10] * 500, [10] * 500, np.random.default_rng(2), ttft_slo=4.0, tbt_slo=0.1)
    ttft = np.array([s.ttft for s in slos])
    tbt = np.array([s.tbt for s in slos])
    assert 2.0 <= ttft.min() and ttft.max() <= 6.0
    assert 0.075 <= tbt.min() and tbt.max() <= 0.125


def test_hetero_jct_share_makes_offline_requests_with_only_a_jct_slo() -> None:
    n = 4000
    outputs = [100] * n
    slos = hetero_slos(
        [600] * n, outputs, np.random.default_rng(3), batch_time=PERF.predict, jct_share=0.25
    )
    offline = [s for s in slos if s.jct is not None]
    assert len(offline) / n == pytest.approx(0.25, abs=0.03)
    assert all(s.ttft is None and s.tbt is None for s in offline)
    base = prefill(600) + 100 * 0.1875
    assert all(0.5 * base <= s.jct <= 1.5 * base for s in offline)
    assert all(s.ttft is not None and s.tbt is not None for s in slos if s.jct is None)


def test_hetero_needs_a_latency_source_or_a_ttft_anchor() -> None:
    with pytest.raises(ValueError, match="--ttft-slo"):
        hetero_slos([10], [10], np.random.default_rng(0))
    with pytest.raises(ValueError, match="--jct-share"):
        hetero_slos([10], [10], np.random.default_rng(0), ttft_slo=1.0, jct_share=1.5)


def test_make_requests_hetero_uses_the_perf_model_and_leaves_priority_zero() -> None:
    lengths = [TraceRequest(100 * (i + 1), 20) for i in range(40)]
    w = make_requests(lengths, num_requests=40, qps=1.0, slo_mix="hetero", batch_time=PERF.predict)
    assert w.info["slo_mix"] == "hetero"
    assert all(r.priority == 0 for r in w.requests)
    for r in w.requests:
        assert r.slo.ttft is not None and r.slo.tbt is not None and r.slo.jct is None
        assert r.slo.ttft <= 1.5 * prefill(((r.prompt_len // 512) + 1) * 512)


def test_make_requests_uniform_when_flags_given_without_a_mix() -> None:
    lengths = [TraceRequest(10, 20)]
    w = make_requests(lengths, num_requests=3, qps=1.0, ttft_slo=2.0, tbt_slo=0.2, jct_slo=30.0)
    assert w.info["slo_mix"] == "uniform"
    assert [r.slo for r in w.requests] == [SLO(2.0, 0.2, 30.0)] * 3
    w = make_requests(lengths, num_requests=3, qps=1.0)
    assert w.info["slo_mix"] == "none" and all(r.slo == SLO() for r in w.requests)
