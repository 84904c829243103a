"""Metric definitions (docs/design.md "Measurements") on hand-built requests, and criteria."""

from __future__ import annotations

import json

import pytest

from sloserve.metrics import check_criterion, format_table, meets, summarize
from sloserve.request import SLO, Request, RequestStatus

FINISHED, DROPPED, RUNNING = RequestStatus.FINISHED, RequestStatus.DROPPED, RequestStatus.RUNNING


def req(
    rid: str,
    arrival: float,
    times: list[float],
    slo: SLO | None = None,
    *,
    status: RequestStatus = FINISHED,
    output_len: int | None = None,
    scheduled: float | None = None,
) -> Request:
    r = Request(rid, arrival, 16, output_len or max(len(times), 1), slo=slo or SLO())
    r.token_times = list(times)
    r.status = status
    r.first_scheduled_time = scheduled
    r.finish_time = times[-1] if status is FINISHED and times else None
    return r


def test_ttft_and_tbt_definitions() -> None:
    a = req("a", 0.0, [0.5, 0.6, 0.8])  # TTFT 0.5, gaps 0.1 0.2, mean 0.15
    b = req("b", 1.0, [2.0, 2.4])  # TTFT 1.0, gap 0.4, mean 0.4
    s = summarize([a, b])
    assert s["ttft_p50"] == pytest.approx(0.75)
    assert s["tbt_p50"] == pytest.approx(0.2)  # pooled gaps 0.1, 0.2, 0.4
    assert s["tbt_p99"] == s["tbt_token_p99"] == pytest.approx(0.2 + 0.98 * 0.2)
    assert s["mean_tbt_p50"] == pytest.approx(0.275)  # means 0.15 and 0.4
    assert s["output_tokens"] == 5
    assert s["duration"] == pytest.approx(2.4)  # last finish - first arrival
    assert s["throughput_tok_s"] == pytest.approx(5 / 2.4)


def test_goodput_requires_ttft_and_mean_tbt_within_each_requests_slo() -> None:
    slo = SLO(ttft=1.0, tbt=0.2)
    ok = req("ok", 0.0, [0.5, 0.6, 0.7], slo)
    late = req("late", 0.0, [1.5, 1.6], slo)  # TTFT miss
    slow = req("slow", 0.0, [0.5, 0.9], slo)  # mean TBT miss
    single = req("one", 0.0, [0.9], slo)  # one token passes TBT
    s = summarize([ok, late, slow, single])
    assert s["good"] == 2 and s["goodput_share"] == 0.5
    assert s["goodput_rps"] == pytest.approx(2 / 1.6)


def test_dropped_and_unfinished_requests_count_as_misses() -> None:
    good = req("g", 0.0, [0.1, 0.2], SLO(ttft=1.0))
    dropped = req("d", 0.0, [], SLO(ttft=1.0), status=DROPPED, output_len=5)
    running = req("r", 0.0, [0.1], status=RUNNING, output_len=5)  # no SLO but unfinished
    s = summarize([good, dropped, running])
    assert (s["requests"], s["completed"], s["dropped"], s["unfinished"]) == (3, 1, 1, 1)
    assert s["goodput_share"] == pytest.approx(1 / 3)


def test_pooled_p99_exposes_stalls_that_per_request_mean_tbt_hides() -> None:
    slo = SLO(ttft=1.0, tbt=0.1)
    reqs = []
    for i in range(10):  # 100 gaps each: 98 of 50 ms and two 2 s stalls -> mean 89 ms
        gaps = [0.05] * 49 + [2.0] + [0.05] * 49 + [2.0]
        times = [float(i)]
        for g in gaps:
            times.append(times[-1] + g)
        reqs.append(req(f"r{i}", float(i) - 0.1, times, slo, scheduled=float(i) - 0.05))
    s = summarize(reqs)
    assert s["mean_tbt_p99"] == pytest.approx(0.089)
    assert s["tbt_token_p99"] == pytest.approx(2.0)
    assert s["goodput_share"] == 1.0
    assert meets(s, "goodput", 0.9)
    assert not meets(s, "tail", tbt_slo=0.1)
    assert s["token_slo_attainment"] == pytest.approx(0.98)


def test_token_criterion_judges_first_token_on_ttft_and_counts_unproduced_tokens() -> None:
    slo = SLO(ttft=1.0, tbt=0.1)
    # 4 of 10 tokens produced, all on time, then the request stopped (unfinished)
    partial = req("p", 0.0, [0.5, 0.55, 0.6, 0.65], slo, status=RUNNING, output_len=10)
    # finished: first token late (TTFT 2 s), 2 gaps on time, 1 late
    late = req("l", 0.0, [2.0, 2.05, 2.1, 2.5], slo)
    no_slo = req("n", 0.0, [5.0, 9.0])  # no targets: not judged
    s = summarize([partial, late, no_slo])
    assert s["token_criterion_share"] == pytest.approx((4 + 2) / (10 + 4))
    assert s["token_slo_attainment"] == pytest.approx((3 + 2) / (3 + 3))
    assert meets(s, "token", 0.4) and not meets(s, "token", 0.5)


def test_dropped_request_tokens_all_miss_the_token_criterion() -> None:
    dropped = req("d", 0.0, [], SLO(ttft=1.0, tbt=0.1), status=DROPPED, output_len=8)
    s = summarize([dropped])
    assert s["token_criterion_share"] == 0.0
    assert s["token_slo_attainment"] is None  # no produced gaps to judge


def test_scheduling_delay_median_over_scheduled_requests() -> None:
    reqs = [
        req("a", 0.0, [1.0], scheduled=0.5),
        req("b", 1.0, [3.0], scheduled=2.5),
        req("c", 2.0, [9.0], scheduled=5.0),
        req("d", 3.0, [], status=DROPPED),
    ]
    assert summarize(reqs)["sched_delay_p50"] == pytest.approx(1.5)


def test_jct_slo_attainment_and_jct_in_goodput() -> None:
    fast = req("f", 0.0, [1.0, 2.0], SLO(jct=3.0))
    slow = req("s", 0.0, [1.0, 5.0], SLO(jct=3.0))
    lost = req("x", 0.0, [], SLO(jct=3.0), status=DROPPED, output_len=2)
    plain = req("p", 0.0, [1.0])
    s = summarize([fast, slow, lost, plain])
    assert s["jct_slo_attainment"] == pytest.approx(1 / 3)
    assert s["good"] == 2  # fast and plain
    assert s["jct_p50"] == pytest.approx(2.0)  # JCTs 2, 5, 1


def test_counters_default_to_requests_and_pass_through() -> None:
    a = req("a", 0.0, [1.0])
    a.num_preemptions = 2
    b = req("b", 0.0, [1.0])
    b.num_preemptions = 1
    assert summarize([a, b])["preemptions"] == 3
    s = summarize([a, b], preemptions=7, kv_utilization=0.6, iterations=12, duration=4.0)
    assert (s["preemptions"], s["kv_utilization"], s["iterations"]) == (7, 0.6, 12)
    assert s["throughput_tok_s"] == 0.5


def test_empty_run_gives_json_valid_summary_without_nan() -> None:
    s = summarize([])
    json.dumps(s, allow_nan=False)
    assert s["requests"] == 0 and s["goodput_share"] is None and s["ttft_p99"] is None
    assert not meets(s, "goodput", 0.9)
    assert not meets(s, "tail", tbt_slo=0.1)


def test_tail_criterion_needs_p99_median_delay_of_all_and_drop_share_within_bounds() -> None:
    base = {"tbt_token_p99": 0.09, "sched_delay_p50_all": 1.9, "drop_share": 0.01}
    assert meets(base, "tail", tbt_slo=0.1)
    assert not meets({**base, "tbt_token_p99": 0.11}, "tail", tbt_slo=0.1)
    assert not meets({**base, "sched_delay_p50_all": 2.1}, "tail", tbt_slo=0.1)
    assert not meets({**base, "sched_delay_p50_all": None}, "tail", tbt_slo=0.1)  # infinite
    assert not meets({**base, "drop_share": 0.011}, "tail", tbt_slo=0.1)
    assert meets({**base, "drop_share": 0.011}, "tail", tbt_slo=0.1, max_drop_share=0.02)
    # the median over scheduled requests alone is not what tail judges (issue 38)
    assert not meets({**base, "sched_delay_p50": 0.1, "sched_delay_p50_all": 3.0}, "tail",
                     tbt_slo=0.1)
    with pytest.raises(ValueError, match="tbt_slo"):
        meets(base, "tail")
    with pytest.raises(ValueError, match="max_drop_share.*1.5"):
        meets(base, "tail", tbt_slo=0.1, max_drop_share=1.5)
    with pytest.raises(ValueError, match="summary: has no 'sched_delay_p50_all'"):
        meets({"tbt_token_p99": 0.09, "sched_delay_p50": 1.9}, "tail", tbt_slo=0.1)


def on_time(i: int, slo: SLO, *, status: RequestStatus = FINISHED) -> Request:
    """Request ``i``: arrives at i, scheduled at once, 4 tokens 10 ms apart from i + 0.1."""
    t = float(i)
    if status is DROPPED:
        return req(f"r{i}", t, [], slo, status=DROPPED, output_len=4)
    return req(f"r{i}", t, [t + 0.1 + 0.01 * k for k in range(4)], slo, scheduled=t)


def test_median_delay_of_all_counts_dropped_and_never_scheduled_as_infinite() -> None:
    slo = SLO(ttft=1.0, tbt=0.1)
    # delays 0.5, 1.0, 1.5 (scheduled, kept), then one dropped after it was scheduled
    # and one never scheduled: sorted with infinity last, the median is 1.5
    reqs = [req(f"k{i}", 0.0, [d + 0.1], slo, scheduled=d) for i, d in enumerate((0.5, 1.0, 1.5))]
    reqs.append(req("d", 0.0, [], slo, status=DROPPED, output_len=3, scheduled=0.2))
    reqs.append(req("n", 0.0, [], slo, status=RUNNING, output_len=3))
    s = summarize(reqs)
    assert s["sched_delay_p50_all"] == pytest.approx(1.5)
    assert s["sched_delay_p50"] == pytest.approx(0.75)  # scheduled ones only: 0.2 .. 1.5
    assert s["drop_share"] == pytest.approx(0.2)
    # an even count: the mean of the middle two, infinite (None) once one of them is
    assert summarize(reqs[:4])["sched_delay_p50_all"] == pytest.approx(1.25)
    assert summarize([*reqs[:2], *reqs[3:]])["sched_delay_p50_all"] is None
    json.dumps(summarize([*reqs[:2], *reqs[3:]]), allow_nan=False)


def test_dropping_every_request_meets_neither_tail_nor_token_at_any_rate() -> None:
    """A policy that drops every request: no gap to fail the P99 and no scheduled
    request to delay, which the old tail rule passed at any rate (issue 38)."""
    for slo in (SLO(ttft=1.0, tbt=0.1), SLO(tbt=0.1), SLO()):
        for rate in (0.1, 1.0, 100.0):
            reqs = [req(f"r{i}", i / rate, [], slo, status=DROPPED, output_len=4)
                    for i in range(50)]
            s = summarize(reqs)
            assert s["drop_share"] == 1.0 and s["sched_delay_p50_all"] is None
            assert not meets(s, "tail", tbt_slo=0.1)
            assert not meets(s, "tail", tbt_slo=0.1, max_drop_share=1.0)  # infinite median
            assert s["token_criterion_share"] == 0.0  # the first token a miss, SLO or not
            assert not meets(s, "token", 0.01)
            assert not meets(s, "goodput", 0.01)


def test_a_drop_share_above_the_bound_fails_tail_where_the_served_requests_meet_it() -> None:
    slo = SLO(ttft=1.0, tbt=0.1)
    served = [on_time(i, slo) for i in range(98)]
    dropped = [on_time(98 + i, slo, status=DROPPED) for i in range(2)]
    s = summarize(served + dropped)
    assert s["drop_share"] == 0.02 and s["sched_delay_p50_all"] == 0.0
    assert not meets(s, "tail", tbt_slo=0.1)  # 2 % dropped > the 1 % default
    assert meets(s, "tail", tbt_slo=0.1, max_drop_share=0.02)
    one = summarize([*served, on_time(98, slo), dropped[1]])  # 1 of 100: at the bound
    assert one["drop_share"] == 0.01 and meets(one, "tail", tbt_slo=0.1)


def test_rates_offered_and_served() -> None:
    slo = SLO(ttft=1.0, tbt=0.1)
    reqs = [on_time(i, slo) for i in range(10)] + [on_time(10, slo, status=DROPPED)]
    s = summarize(reqs)
    assert s["offered_rps"] == pytest.approx(10 / 10.0)  # 11 arrivals over 10 s
    duration = s["duration"]
    assert duration is not None and s["served_rps"] == pytest.approx(10 / duration)


def test_unknown_criterion_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="criterion.*'p95'"):
        meets({}, "p95", 0.9)
    with pytest.raises(ValueError, match="criterion.*'p95'"):
        check_criterion("p95")
    check_criterion("tail", tbt_slo=0.1)


def test_format_table_shows_units() -> None:
    table = format_table(summarize([req("a", 0.0, [0.5, 0.6], SLO(ttft=1.0))]))
    assert "ttft_p50" in table and "500.0 ms" in table and "100.0 %" in table
