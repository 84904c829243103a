"""Arrival processes and ``make_requests`` (sampling, determinism, limits, validation)."""

from __future__ import annotations

import numpy as np
import pytest

from sloserve.workload.arrivals import gamma_arrivals, poisson_arrivals, trace_arrivals
from sloserve.workload.generate import make_requests
from sloserve.workload.traces import TraceRequest, load_trace


def rate_and_cv(t: np.ndarray) -> tuple[float, float]:
    gaps = np.diff(t)
    return 1.0 / float(gaps.mean()), float(gaps.std() / gaps.mean())


def test_poisson_mean_rate_is_qps_and_cv_one() -> None:
    t = poisson_arrivals(50_000, 8.0, np.random.default_rng(1))
    rate, cv = rate_and_cv(t)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert rate == pytest.approx(8.0, rel=0.02)
    assert cv == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_mean_rate_is_qps_with_requested_cv(cv: float) -> None:
    t = gamma_arrivals(200_000, 3.0, cv, np.random.default_rng(2))
    rate, got_cv = rate_and_cv(t)
    assert rate == pytest.approx(3.0, rel=0.02)
    assert got_cv == pytest.approx(cv, rel=0.03)


def test_arrivals_deterministic_per_seed() -> None:
    a = gamma_arrivals(100, 2.0, 3.0, np.random.default_rng(7))
    b = gamma_arrivals(100, 2.0, 3.0, np.random.default_rng(7))
    c = gamma_arrivals(100, 2.0, 3.0, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_trace_arrivals_rescaled_to_target_rate_keeping_shape() -> None:
    t = trace_arrivals([10.0, 11.0, 13.0, 14.0], qps=6.0)  # 3 gaps over 4 s -> over 0.5 s
    assert t.tolist() == pytest.approx([0.0, 0.125, 0.375, 0.5])
    assert trace_arrivals([10.0, 11.0]).tolist() == [0.0, 1.0]


@pytest.mark.parametrize(
    ("call", "flag"),
    [
        (lambda r: poisson_arrivals(0, 1.0, r), "--num-requests"),
        (lambda r: poisson_arrivals(5, 0.0, r), "--qps"),
        (lambda r: poisson_arrivals(5, float("inf"), r), "--qps"),
        (lambda r: gamma_arrivals(5, 1.0, 0.0, r), "--cv"),
        (lambda r: trace_arrivals([1.0, 1.0], qps=2.0), "--qps"),
    ],
)
def test_bad_arrival_arguments_name_the_flag(call: object, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        call(np.random.default_rng(0))  # type: ignore[operator]


# --- make_requests -----------------------------------------------------------

LENGTHS = [TraceRequest(100 * (i + 1), 10 + i, arrival=2.0 * i) for i in range(50)]


def snapshot(w: object) -> list[tuple[object, ...]]:
    return [
        (r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.slo.ttft, r.slo.tbt)
        for r in w.requests  # type: ignore[attr-defined]
    ]


def test_make_requests_deterministic_for_a_seed() -> None:
    kw = dict(num_requests=200, qps=4.0, arrival="gamma", cv=2.0, slo_mix="hetero", ttft_slo=1.0)
    a = make_requests(LENGTHS, seed=3, **kw)
    b = make_requests(LENGTHS, seed=3, **kw)
    c = make_requests(LENGTHS, seed=4, **kw)
    assert snapshot(a) == snapshot(b) != snapshot(c)
    assert a.requests[42].request_id == "r000042"


def test_lengths_arrivals_and_slos_use_independent_streams() -> None:
    plain = make_requests(LENGTHS, num_requests=30, qps=2.0, seed=5)
    mixed = make_requests(LENGTHS, num_requests=30, qps=2.0, seed=5, slo_mix="hetero", ttft_slo=2.0)
    assert [s[:4] for s in snapshot(plain)] == [s[:4] for s in snapshot(mixed)]
    bursty = make_requests(
        LENGTHS,
        num_requests=30,
        qps=2.0,
        seed=5,
        arrival="gamma",
        cv=4.0,
        slo_mix="hetero",
        ttft_slo=2.0,
    )
    same = [(s[0], *s[2:]) for s in snapshot(mixed)]
    assert same == [(s[0], *s[2:]) for s in snapshot(bursty)]  # only arrival times differ


def test_sampling_without_replacement_when_trace_is_long_enough() -> None:
    w = make_requests(LENGTHS, num_requests=50, qps=1.0)
    assert sorted(r.prompt_len for r in w.requests) == [100 * (i + 1) for i in range(50)]
    assert w.info["sampled_with_replacement"] is False
    w = make_requests(LENGTHS, num_requests=500, qps=1.0)
    assert len(w.requests) == 500 and w.info["sampled_with_replacement"] is True


def test_too_long_requests_dropped_and_counted_not_crashed() -> None:
    w = make_requests(LENGTHS, num_requests=50, qps=1.0, max_context=1020)
    # prompt + output = 100(i+1) + 10 + i <= 1020 for i <= 9
    assert w.num_too_long == 40 and len(w.requests) == 10
    assert all(r.prompt_len + r.output_len <= 1020 for r in w.requests)
    full = make_requests(LENGTHS, num_requests=50, qps=1.0)
    kept = {r.request_id: r.prompt_len for r in full.requests}
    assert all(kept[r.request_id] == r.prompt_len for r in w.requests)  # ids stable


def test_trace_arrivals_take_consecutive_rows_optionally_rescaled() -> None:
    w = make_requests(LENGTHS, num_requests=5, qps=None, arrival="trace")
    assert [(r.prompt_len, r.arrival_time) for r in w.requests] == [
        (100 * (i + 1), 2.0 * i) for i in range(5)
    ]
    w = make_requests(LENGTHS, num_requests=5, qps=1.0, arrival="trace")
    assert [r.arrival_time for r in w.requests] == pytest.approx([0, 1, 2, 3, 4])


def test_real_trace_poisson_workload_hits_target_rate() -> None:
    w = make_requests(load_trace("sharegpt"), num_requests=5000, qps=10.0, seed=1)
    assert w.info["offered_qps"] == pytest.approx(10.0, rel=0.05)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        (dict(num_requests=0, qps=1.0), "--num-requests"),
        (dict(num_requests=5, qps=-1.0), "--qps"),
        (dict(num_requests=5, qps=None), "--qps"),
        (dict(num_requests=5, qps=1.0, arrival="uniform"), "--arrival"),
        (dict(num_requests=5, qps=1.0, slo_mix="strict"), "--slo-mix"),
        (dict(num_requests=5, qps=1.0, max_context=1), "--max-context"),
        (dict(num_requests=5, qps=1.0, ttft_slo=0.0), "ttft_slo"),
        (dict(num_requests=51, qps=None, arrival="trace"), "--num-requests"),
        (dict(num_requests=5, qps=1.0, slo_mix="hetero"), "--ttft-slo"),
    ],
)
def test_make_requests_rejects_bad_arguments_naming_the_flag(
    kwargs: dict[str, object], flag: str
) -> None:
    with pytest.raises(ValueError, match=flag):
        make_requests(LENGTHS, **kwargs)


def test_trace_arrival_needs_timestamps() -> None:
    with pytest.raises(ValueError, match="arrival times"):
        make_requests([TraceRequest(1, 1)], num_requests=1, qps=None, arrival="trace")
