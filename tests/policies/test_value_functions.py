"""Ascendra §5.2/§8.4: value functions order LP waiting prefills (ascending sort keys)."""

from __future__ import annotations

import pytest
from helpers import req

from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.ascendra_queue import ValueQueue, prefill_time
from sloserve.policies.value_functions import get_value_function
from sloserve.request import Request

# Phi: 1 ms per prompt token, nothing else
PHI = LinearPerfModel(base=0.0, per_token=0.001, per_ctx=0.0)


def order(name: str, reqs: list[Request]) -> list[str]:
    vf = get_value_function(name)
    return [r.request_id for r in sorted(reqs, key=lambda r: vf(r, prefill_time(PHI, r)))]


def test_edf_ranks_by_slack_so_a_longer_later_prompt_outranks_a_short_earlier_one() -> None:
    # §3.3: urgency depends on prompt length and time in system. Same 1 s TTFT SLO:
    # "short" may start until 0.9 s, "long" (2 s of prefill) is already late to start.
    reqs = [req("short", 100, arrival=0.0, ttft=1.0), req("long", 2000, arrival=0.05, ttft=1.0)]
    assert order("edf", reqs) == ["long", "short"]
    assert order("fcfs", reqs) == ["short", "long"]


def test_edf_orders_by_latest_start_and_puts_requests_without_ttft_slo_last() -> None:
    reqs = [
        req("none", 10, arrival=0.0, ttft=None),
        req("late", 10, arrival=0.0, ttft=5.0),  # may start until 4.99
        req("soon", 10, arrival=2.0, ttft=1.0),  # 2.99: arrived later, due earlier
        req("mid", 10, arrival=1.0, ttft=3.0),  # 3.99
    ]
    assert order("edf", reqs) == ["soon", "mid", "late", "none"]


def test_priority_serves_premium_before_free_tier_and_edf_within_a_tier() -> None:
    reqs = [
        req("free_urgent", 10, arrival=0.0, ttft=0.5, priority=0),
        req("premium_relaxed", 10, arrival=0.0, ttft=5.0, priority=1),
        req("premium_urgent", 10, arrival=1.0, ttft=1.0, priority=1),
        req("free_relaxed", 10, arrival=0.0, ttft=9.0, priority=0),
    ]
    assert order("priority", reqs) == [
        "premium_urgent", "premium_relaxed", "free_urgent", "free_relaxed"]


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


def pops(q: ValueQueue) -> list[str]:
    out = []
    while (e := q.pop()) is not None:
        out.append(e[2].request_id)
    return out


def test_value_queue_pops_in_value_order_and_follows_arrivals_and_departures() -> None:
    q = ValueQueue(get_value_function("edf"))
    a, b, c = (req("a", 10, arrival=0.0, ttft=3.0), req("b", 10, arrival=0.1, ttft=1.0),
               req("c", 10, arrival=0.2, ttft=2.0))
    q.sync([a, b], PHI)
    q.sync([a, b, c], PHI)  # c arrives; nothing is re-sorted
    first = q.pop()
    assert first is not None and first[2] is b
    q.push_back([first])
    q.sync([a, c], PHI)  # b left (admitted elsewhere): its entry is skipped
    assert pops(q) == ["c", "a"]


def test_value_queue_rekeys_when_the_regression_is_refitted() -> None:
    # Phi slow: "long" (1000 tokens) may start later than "short"; Phi fast: the reverse
    q = ValueQueue(get_value_function("edf"))
    short, long = req("short", 100, ttft=1.0), req("long", 1000, ttft=1.2)
    q.sync([short, long], LinearPerfModel(base=0.0, per_token=0.0001, per_ctx=0.0))
    assert pops(q) == ["short", "long"]
    q.sync([short, long], LinearPerfModel(base=0.0, per_token=0.001, per_ctx=0.0))
    assert pops(q) == ["long", "short"]
