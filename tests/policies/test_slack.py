"""``slack``: TBT-slack token budget, latest-start order, early TTFT shedding (docs/beyond.md)."""

from __future__ import annotations

import pytest

from sloserve.batch import BatchShape
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.policies.slack import LATE_REASON, SHED_REASON, SlackConfig, SlackPolicy
from sloserve.request import SLO, Request

PERF = LinearPerfModel()  # 10 ms + 0.2 ms per token + 0.1 us per context token


def inst(**knobs: object) -> Instance:
    return Instance("lp0", SlackPolicy(SlackConfig(**knobs)), BlockManager(4000, 16), PERF)


def req(rid: str, prompt: int, output: int = 50, arrival: float = 0.0, ttft: float | None = 1.0,
        tbt: float | None = 0.1) -> Request:
    return Request(rid, arrival, prompt, output, SLO(ttft=ttft, tbt=tbt))


def with_decode(tbt: float | None, last_token_age: float, **knobs: object) -> Instance:
    """An instance whose one running decode produced its last token ``last_token_age`` ago
    (at t = 1.0)."""
    i = inst(**knobs)
    i.add_request(req("d", 100, tbt=tbt), 0.0)
    plan, _, _ = i.schedule(0.0)
    i.complete(plan, 1.0 - last_token_age)
    return i


def chunk_of(plan: object, rid: str) -> int:
    return next(it.num_tokens for it in plan.items if it.request_id == rid)  # type: ignore[attr-defined]


def test_registered_by_name() -> None:
    assert get_spec("slack").roles["lp"] is SlackPolicy


def test_no_decode_prefills_whole_prompts_like_vllm() -> None:
    i = inst()
    i.add_request(req("a", 3000, ttft=2.0), 0.0)
    i.add_request(req("b", 2000, ttft=2.0), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert sorted((it.request_id, it.num_tokens) for it in plan.items) == [("a", 3000),
                                                                          ("b", 2000)]


def test_budget_fits_the_tightest_tbt_slack() -> None:
    for age in (0.0, 0.04):
        i = with_decode(0.1, age)
        i.add_request(req("p", 3000, arrival=0.9), 0.9)
        plan, _, _ = i.schedule(1.0)
        n = chunk_of(plan, "p")
        limit = 0.8 * (0.1 - age)
        def t(k: int) -> float:
            return PERF.predict(BatchShape(prefills=((k, 0),), decodes=(100,)))
        assert t(n) <= limit < t(n + 1), (age, n)
        assert chunk_of(plan, "d") == 1  # the decode is never stalled


def test_a_decode_without_tbt_slo_does_not_limit_the_budget() -> None:
    i = with_decode(None, 0.0)
    i.add_request(req("p", 3000, arrival=0.9), 0.9)
    plan, _, _ = i.schedule(1.0)
    assert chunk_of(plan, "p") == 3000


def test_spent_slack_still_lets_min_prefill_tokens_through() -> None:
    i = with_decode(0.1, 0.5, min_prefill_tokens=40)
    i.add_request(req("p", 3000, arrival=0.9, ttft=10.0), 0.9)
    plan, _, _ = i.schedule(1.0)
    assert chunk_of(plan, "p") == 40


def test_waiting_requests_go_by_latest_start_not_arrival() -> None:
    i = inst(max_num_batched_tokens=1000)
    i.add_request(req("loose", 500, arrival=0.0, ttft=5.0), 0.0)
    i.add_request(req("tight", 500, arrival=0.01, ttft=0.5), 0.01)
    plan, _, _ = i.schedule(0.01)
    assert [it.request_id for it in plan.items] == ["tight", "loose"]


def test_longer_prompt_has_less_slack_and_goes_first() -> None:
    i = inst(max_num_batched_tokens=1000)
    i.add_request(req("short", 100), 0.0)
    i.add_request(req("long", 1000), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("long", 1000)]


def test_sheds_a_request_that_cannot_meet_its_ttft_alone() -> None:
    i = inst(shed_window=0)  # the latest-start rule alone, without Moore-Hodgson
    i.add_request(req("late", 2000, ttft=0.2), 0.0)  # 0.41 s of prefill alone > 0.2 s
    i.add_request(req("ok", 100), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == ["late"] and plan.drop_reasons["late"] == SHED_REASON
    assert [it.request_id for it in plan.items] == ["ok"]


def test_a_hopeless_request_shed_by_moore_hodgson_gets_the_hopeless_reason() -> None:
    i = inst()
    i.add_request(req("late", 2000, ttft=0.2), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == ["late"] and plan.drop_reasons["late"] == SHED_REASON


def test_sheds_a_request_the_tbt_bounded_budget_cannot_prefill_in_time() -> None:
    # alone: 0.01 + 0.2 ms x 1500 = 0.31 s < 0.35 s; at ~330 tokens per 0.08 s iteration it
    # needs 5 iterations = 0.4 s > 0.35 s
    i = with_decode(0.1, 0.0)
    i.add_request(req("p", 1500, arrival=1.0, ttft=0.35), 1.0)
    plan, _, _ = i.schedule(1.0)
    assert plan.dropped == ["p"]


def test_moore_hodgson_sheds_the_longest_so_the_rest_meet_their_ttft() -> None:
    # alone: 0.41 s per 2000-token prompt, 0.03 s for the short one; in latest-start order
    # l1, l2, s ends s at 0.85 s > its 0.84 s TTFT: shed a long prompt (not the late short
    # one), and l + s both end in time
    i = inst()
    for rid in ("l1", "l2"):
        i.add_request(req(rid, 2000), 0.0)
    i.add_request(req("s", 100, ttft=0.84), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert len(plan.dropped) == 1 and plan.dropped[0].startswith("l")
    assert plan.drop_reasons[plan.dropped[0]] == LATE_REASON
    assert "s" in {it.request_id for it in plan.items}


def test_shed_window_zero_sheds_only_the_hopeless() -> None:
    i = inst(shed_window=0)
    for rid in ("l1", "l2"):
        i.add_request(req(rid, 2000), 0.0)
    i.add_request(req("s", 100, ttft=0.84), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == [] and len(plan.items) == 3


def test_a_short_prompt_that_fits_its_tight_ttft_in_one_iteration_is_kept() -> None:
    # one 50-token chunk beside the decode: 0.02 s predicted < 0.05 s TTFT, though the
    # iteration limit (0.08 s) is longer than the TTFT
    i = with_decode(0.1, 0.0)
    i.add_request(req("short", 50, arrival=1.0, ttft=0.05), 1.0)
    plan, _, _ = i.schedule(1.0)
    assert plan.dropped == [] and chunk_of(plan, "short") == 50


def test_shed_off_keeps_every_request() -> None:
    i = inst(shed=False)
    i.add_request(req("late", 2000, ttft=0.2), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == [] and chunk_of(plan, "late") == 2000


def test_preempted_requests_are_queued_again() -> None:
    i = inst()
    for rid in ("a", "b"):
        i.add_request(req(rid, 200), 0.0)
    plan, _, _ = i.schedule(0.0)
    i.complete(plan, 0.05)
    back = i.preempt_all()
    assert {r.request_id for r in back} == {"a", "b"}
    plan, _, _ = i.schedule(0.05)
    assert sorted(it.request_id for it in plan.items) == ["a", "b"]


@pytest.mark.parametrize("field,value", [("tbt_margin", 0.0), ("tbt_margin", 1.5),
                                         ("max_num_batched_tokens", 0),
                                         ("min_prefill_tokens", -1), ("shed", "yes"),
                                         ("shed_window", -1)])
def test_bad_knob_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SlackConfig(**{field: value})  # type: ignore[arg-type]
