"""Ascendra §5.2: value functions order LP waiting prefills (ascending sort keys)."""

from __future__ import annotations

import pytest
from helpers import req

from sloserve.policies.value_functions import get_value_function


def order(name: str, reqs: list, now: float = 0.0) -> list[str]:
    vf = get_value_function(name)
    return [r.request_id for r in sorted(reqs, key=lambda r: vf(r, now))]


def test_edf_orders_by_ttft_deadline_and_puts_requests_without_ttft_slo_last() -> None:
    reqs = [
        req("none", 10, arrival=0.0, ttft=None),
        req("late", 10, arrival=0.0, ttft=5.0),  # deadline 5.0
        req("soon", 10, arrival=2.0, ttft=1.0),  # deadline 3.0: arrived later, due earlier
        req("mid", 10, arrival=1.0, ttft=3.0),  # deadline 4.0
    ]
    assert order("edf", reqs) == ["soon", "mid", "late", "none"]


def test_sjf_and_ljf_order_by_prefill_length() -> None:
    reqs = [req("m", 200, arrival=0.0), req("s", 50, arrival=1.0), req("l", 900, arrival=2.0)]
    assert order("sjf", reqs) == ["s", "m", "l"]
    assert order("ljf", reqs) == ["l", "m", "s"]


def test_sjf_counts_tokens_to_recompute_after_preemption() -> None:
    preempted = req("p", 100, output=50)
    preempted.num_generated = 40  # preempted by recompute: 140 tokens to prefill again
    assert order("sjf", [preempted, req("fresh", 120, arrival=1.0)]) == ["fresh", "p"]


def test_fcfs_orders_by_arrival_time() -> None:
    reqs = [req("b", 10, arrival=2.0), req("a", 900, arrival=1.0), req("c", 1, arrival=3.0)]
    assert order("fcfs", reqs) == ["a", "b", "c"]


def test_unknown_value_function_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="value_function.*'lifo'"):
        get_value_function("lifo")
