"""``slack``: TBT-slack token budget; deadline order with Moore-Hodgson and Smith's rule;
requests that cannot make their TTFT deferred to a background lane, dropped or served
(docs/lab/beyond.md, "Our policy")."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.batch import BatchShape
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.policies.slack import (
    LATE_REASON,
    SHED_REASON,
    SlackConfig,
    SlackPolicy,
)
from sloserve.policies.slack_rules import (
    first_token_room,
    moore_hodgson,
    smith_order,
    tile_aligned,
)
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
        i = with_decode(0.1, age, tile=0)  # the exact fit, not cut to whole tiles
        i.add_request(req("p", 3000, arrival=0.9), 0.9)
        plan, _, _ = i.schedule(1.0)
        n = chunk_of(plan, "p")
        limit = 0.8 * (0.1 - age)
        def t(k: int) -> float:
            return PERF.predict(BatchShape(prefills=((k, 0),), decodes=(100,)))
        assert t(n) <= limit < t(n + 1), (age, n)
        assert chunk_of(plan, "d") == 1  # the decode is never stalled


def test_a_tbt_bounded_iteration_ends_on_a_whole_tile() -> None:
    # 0.08 s fits the decode and ~349 prompt tokens; cut to 255 so that the iteration is
    # 256 tokens: two whole tiles of 128 (Sarathi-Serve §4.3)
    i = with_decode(0.1, 0.0)
    i.add_request(req("p", 3000, arrival=0.9, ttft=10.0), 0.9)
    plan, _, _ = i.schedule(1.0)
    n = chunk_of(plan, "p")
    assert (n + 1) % 128 == 0 and PERF.predict(
        BatchShape(prefills=((n + 128, 0),), decodes=(100,))) > 0.8 * 0.1, n


def test_iterations_are_priced_at_their_predicted_time_not_the_limit() -> None:
    # "p" (3,000 tokens, 0.9 s left) needs 12 iterations of 255 tokens: 0.96 s if each took
    # the 0.08 s limit, 0.73 s at their predicted 61 ms. Priced at the limit, Moore-Hodgson
    # would give it up.
    i = with_decode(0.1, 0.0, late="drop")
    i.add_request(req("p", 3000, arrival=0.9, ttft=1.0), 0.9)
    plan, _, _ = i.schedule(1.0)
    assert plan.dropped == [] and chunk_of(plan, "p") == 255


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9000), st.integers(0, 300), st.sampled_from([0, 64, 128]))
def test_tile_aligned_cuts_to_the_last_whole_tile_and_never_below_one(
        allowance: int, decodes: int, tile: int) -> None:
    got = tile_aligned(allowance, decodes, tile)
    assert got <= allowance
    if tile == 0 or decodes + allowance <= tile:
        assert got == allowance
    else:
        assert got >= min(allowance, tile) and got > allowance - tile
        assert (decodes + got) % tile == 0 or got == min(allowance, tile)


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


def test_latest_start_order_puts_the_longer_prompt_first() -> None:
    i = inst(max_num_batched_tokens=1000, order="latest-start")
    i.add_request(req("short", 100), 0.0)
    i.add_request(req("long", 1000), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("long", 1000)]


def test_smith_puts_the_short_prompt_first_when_the_long_one_still_makes_it() -> None:
    # same deadline (1 s); alone 0.03 s + 0.21 s: both end in time either way, so the
    # short one goes first (less total completion time) and the long one takes the rest
    i = inst(max_num_batched_tokens=1000)
    i.add_request(req("short", 100), 0.0)
    i.add_request(req("long", 1000), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("short", 100),
                                                                     ("long", 900)]


def test_smith_puts_an_urgent_long_prompt_first() -> None:
    # the long one (0.21 s alone) is due at 0.22 s: after the short one (0.03 s) it
    # would end at 0.24 s, so it goes first although it is longer
    i = inst(max_num_batched_tokens=1000)
    i.add_request(req("short", 100), 0.0)
    i.add_request(req("long", 1000, ttft=0.22), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("long", 1000)]


def test_edf_order_goes_by_deadline_only() -> None:
    i = inst(max_num_batched_tokens=1000, order="edf")
    i.add_request(req("long", 1000, arrival=0.0), 0.0)
    i.add_request(req("short", 100, arrival=0.01), 0.01)
    plan, _, _ = i.schedule(0.01)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("long", 1000)]


def test_sheds_a_request_that_cannot_meet_its_ttft_alone() -> None:
    i = inst(shed_window=0, late="drop")  # the latest-start rule alone, no Moore-Hodgson
    i.add_request(req("late", 2000, ttft=0.2), 0.0)  # 0.41 s of prefill alone > 0.2 s
    i.add_request(req("ok", 100), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == ["late"] and plan.drop_reasons["late"] == SHED_REASON
    assert [it.request_id for it in plan.items] == ["ok"]


def test_a_hopeless_request_shed_by_moore_hodgson_gets_the_hopeless_reason() -> None:
    i = inst(late="drop")
    i.add_request(req("late", 2000, ttft=0.2), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == ["late"] and plan.drop_reasons["late"] == SHED_REASON


def test_sheds_a_request_the_tbt_bounded_budget_cannot_prefill_in_time() -> None:
    # alone: 0.01 + 0.2 ms x 1500 = 0.31 s < 0.35 s; at ~330 tokens per 0.08 s iteration it
    # needs 5 iterations = 0.4 s > 0.35 s
    i = with_decode(0.1, 0.0, late="drop")
    i.add_request(req("p", 1500, arrival=1.0, ttft=0.35), 1.0)
    plan, _, _ = i.schedule(1.0)
    assert plan.dropped == ["p"]


def test_deadline_order_keeps_what_the_latest_start_order_shed() -> None:
    # alone: 0.41 s per 2000-token prompt, 0.03 s for the short one. In latest-start
    # order (l1, l2, s) s would end at 0.85 s > its 0.84 s TTFT and a long prompt was
    # shed; in deadline order (s, l1, l2: Jackson's rule) all three end in time
    # (first_token_cap 0: with it, "l2" would be cut so that 1.2 x the iteration ends by
    # "s"'s TTFT; tested below)
    i = inst(late="drop", first_token_cap=0.0)
    for rid in ("l1", "l2"):
        i.add_request(req(rid, 2000), 0.0)
    i.add_request(req("s", 100, ttft=0.84), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == []
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [
        ("s", 100), ("l1", 2000), ("l2", 2000)]
    old = inst(late="drop", order="latest-start")
    for rid in ("l1", "l2"):
        old.add_request(req(rid, 2000), 0.0)
    old.add_request(req("s", 100, ttft=0.84), 0.0)
    plan, _, _ = old.schedule(0.0)
    assert len(plan.dropped) == 1 and plan.dropped[0].startswith("l")


def test_moore_hodgson_sheds_the_longest_so_the_rest_meet_their_ttft() -> None:
    # both long prompts due at 0.7 s: the second would end at 0.82 s, so one long prompt
    # is shed (not the short one), and the other long one + the short one end in time
    i = inst(late="drop")
    for rid in ("l1", "l2"):
        i.add_request(req(rid, 2000, ttft=0.7), 0.0)
    i.add_request(req("s", 100, ttft=0.84), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert len(plan.dropped) == 1 and plan.dropped[0].startswith("l")
    assert plan.drop_reasons[plan.dropped[0]] == LATE_REASON
    assert {it.request_id for it in plan.items} == {"s", "l1", "l2"} - set(plan.dropped)


def test_shed_window_zero_sheds_only_the_hopeless() -> None:
    i = inst(shed_window=0, late="drop")
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


def test_serve_keeps_every_request() -> None:
    i = inst(late="serve")
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
                                         ("min_prefill_tokens", -1), ("late", "yes"),
                                         ("order", "sjf"), ("late_chunk", 0),
                                         ("late_max_running", 0), ("shed_window", -1),
                                         ("first_token_cap", -0.5)])
def test_bad_knob_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SlackConfig(**{field: value})  # type: ignore[arg-type]


# --- what happens to a request given up: triage (default), defer -----------------------


def test_triage_is_the_default_and_defers_a_request_that_never_could_make_it() -> None:
    assert SlackConfig().late == "triage"
    i = inst(late_chunk=300)
    i.add_request(req("late", 2000, ttft=0.2), 0.0)  # 0.41 s alone > 0.2 s: never could
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == []
    # an idle GPU serves it at once, in background chunks
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("late", 300)]
    i.complete(plan, 0.1)
    plan, _, _ = i.schedule(0.1)
    assert chunk_of(plan, "late") == 300


def test_triage_drops_a_request_the_load_made_late() -> None:
    # feasible alone (0.41 s < 0.7 s), but the other long prompt due at 0.7 s makes one
    # of them late: Moore-Hodgson gives it up, and triage drops it (no drop budget)
    i = inst(drop_budget=1.0)
    for rid in ("l1", "l2"):
        i.add_request(req(rid, 2000, ttft=0.7), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert len(plan.dropped) == 1 and plan.drop_reasons[plan.dropped[0]] == LATE_REASON


def test_triage_drops_a_request_whose_latest_start_passed_while_others_wait() -> None:
    i = inst(shed_window=0, drop_budget=1.0)
    i.add_request(req("w", 1000, ttft=0.5), 0.0)  # 0.21 s alone: could make it at first
    i.add_request(req("other", 100, ttft=5.0), 0.0)
    plan, _, _ = i.schedule(0.4)  # 0.4 + 0.21 > 0.5: its latest start has passed
    assert plan.dropped == ["w"] and plan.drop_reasons["w"] == SHED_REASON


@pytest.mark.parametrize("budget", [0.01, 0.1])
def test_triage_drops_at_most_drop_budget_of_the_requests_given_and_defers_the_rest(
        budget: float) -> None:
    # issue 38: a burst of 100 long prompts all due at 0.7 s; each takes 0.41 s alone, so
    # Moore-Hodgson keeps one and gives up 99 -- triage drops only its budget's share of the
    # 100 requests given and defers the rest to the background lane
    i = inst(drop_budget=budget)
    for k in range(100):
        i.add_request(req(f"l{k}", 2000, ttft=0.7), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert len(plan.dropped) == round(budget * 100)
    assert all(plan.drop_reasons[r] == LATE_REASON for r in plan.dropped)
    waiting = {r.request_id for r in i.waiting} - {it.request_id for it in plan.items}
    assert len(waiting) == 100 - len(plan.dropped) - len(plan.items)  # deferred, not lost
    assert SlackConfig().drop_budget == 0.01  # the tail criterion's default bound


def test_the_drop_budget_grows_with_the_requests_given() -> None:
    # after 100 more requests, one more drop is allowed (1 % of 200), not before
    i = inst()
    for k in range(100):
        i.add_request(req(f"a{k}", 2000, ttft=0.7), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert len(plan.dropped) == 1
    i.complete(plan, 0.5)
    for k in range(99):
        i.add_request(req(f"b{k}", 2000, ttft=0.7, arrival=0.5), 0.5)
    plan, _, _ = i.schedule(0.5)
    assert plan.dropped == []
    i.complete(plan, 1.0)
    i.add_request(req("c", 2000, ttft=0.5, arrival=1.0), 1.0)
    i.add_request(req("d", 2000, ttft=0.5, arrival=1.0), 1.0)
    plan, _, _ = i.schedule(1.0)
    assert len(plan.dropped) == 1


def test_triage_defers_a_request_late_with_nobody_else_waiting() -> None:
    # the same request alone in the queue: it only waited for the GPU, not for others, so
    # it is served in the background rather than refused
    i = inst(shed_window=0, late_chunk=256)
    i.add_request(req("w", 1000, ttft=0.5), 0.0)
    plan, _, _ = i.schedule(0.4)
    assert plan.dropped == [] and chunk_of(plan, "w") == 256


def test_defer_never_drops() -> None:
    i = inst(late="defer")
    for rid in ("l1", "l2"):
        i.add_request(req(rid, 2000, ttft=0.7), 0.0)
    i.add_request(req("x", 2000, ttft=0.2), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert plan.dropped == []


def test_moore_hodgson_defers_the_longest_behind_the_on_time_ones() -> None:
    # as the drop test above: one long prompt is given up, the other and the short one
    # are admitted whole; the given-up one gets only a background chunk after them
    i = inst(late="defer", late_chunk=256)
    for rid in ("l1", "l2"):
        i.add_request(req(rid, 2000, ttft=0.7), 0.0)
    i.add_request(req("s", 100, ttft=0.84), 0.0)
    plan, _, _ = i.schedule(0.0)
    got = [(it.request_id, it.num_tokens) for it in plan.items]
    assert plan.dropped == [] and len(got) == 3
    late = got[-1][0]
    assert late.startswith("l") and got[-1][1] == 256
    kept = ({"l1", "l2"} - {late}).pop()
    assert sorted(got[:2]) == sorted([("s", 100), (kept, 2000)])


def test_on_time_requests_go_before_deferred_ones_and_a_held_one_stops_the_background(
) -> None:
    # budget 500: the on-time request takes it all, so the deferred one waits
    i = inst(max_num_batched_tokens=500, late="defer")
    i.add_request(req("late", 2000, ttft=0.2), 0.0)
    i.add_request(req("ok", 800, ttft=5.0), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("ok", 500)]
    assert plan.dropped == []


def test_at_most_late_max_running_deferred_requests_run_at_once() -> None:
    i = inst(late_max_running=2, late="defer", late_chunk=4100)
    for k in range(4):
        i.add_request(req(f"late{k}", 2000 + k, ttft=0.2), 0.0)
    t = 0.0
    plan, _, _ = i.schedule(t)
    # shortest remaining prompt first among the deferred
    assert [it.request_id for it in plan.items] == ["late0", "late1"]
    for _ in range(12):  # prefill and decode: no third deferred request joins them
        t += 0.05
        i.complete(plan, t)
        plan, _, _ = i.schedule(t)
        assert {it.request_id for it in plan.items} == {"late0", "late1"}


def test_deferred_prefills_take_at_most_late_chunk_tokens_per_iteration_all_together() -> None:
    i = inst(late="defer", late_chunk=300, tile=0)
    i.add_request(req("late0", 200, ttft=0.001), 0.0)
    i.add_request(req("late1", 1000, ttft=0.001), 0.0)
    i.add_request(req("late2", 1001, ttft=0.001), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("late0", 200),
                                                                      ("late1", 100)]
    i.complete(plan, 0.05)
    plan, _, _ = i.schedule(0.05)  # late1 goes on; late2 waits for tokens to be left
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("late0", 1),
                                                                      ("late1", 300)]


def deferred_decode_then_prompt(tbt: float, **knobs: object) -> Instance:
    """A deferred request ("late", it never could make its TTFT) decoding with TBT SLO
    ``tbt`` since t = 0.05, when an on-time prompt ("p") arrives."""
    i = inst(late="defer", **knobs)
    i.add_request(req("late", 100, ttft=0.001, tbt=tbt), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert chunk_of(plan, "late") == 100
    i.complete(plan, 0.05)
    i.add_request(req("p", 400, arrival=0.05, ttft=0.2), 0.05)
    return i


@pytest.mark.parametrize("tbt,late_yield,runs", [
    (10.0, True, False),  # slack to spare: it sits out the on-time prefill
    (0.1, True, True),  # due before the next iteration (now + 2 x 90 ms): it runs
    (10.0, False, True),  # late_yield off: deferred decodes run in every iteration
])
def test_a_deferred_decode_sits_out_on_time_prefill_unless_its_next_token_is_due(
        tbt: float, late_yield: bool, runs: bool) -> None:
    i = deferred_decode_then_prompt(tbt, late_yield=late_yield, late_bound="off")
    plan, _, _ = i.schedule(0.05)
    assert chunk_of(plan, "p") == 400
    assert any(it.request_id == "late" for it in plan.items) is runs
    i.complete(plan, 0.14)
    plan, _, _ = i.schedule(0.14)  # no on-time prefill left: the deferred decode runs
    assert {it.request_id for it in plan.items} == {"p", "late"}


@pytest.mark.parametrize("late_bound,ttft,chunked", [
    # 0.8 x the deferred decode's 0.1 s slack: ~349 tokens per 80 ms iteration; "p"
    # (400 tokens, 90 ms whole) still ends its two chunks by 0.05 + 0.2 s: chunked
    ("always", 0.2, True),
    ("idle", 0.2, True),  # no on-time decode sets the budget: the same
    # due at 0.15 s, "p" makes it only whole (two chunks end at ~0.21 s): whole
    ("always", 0.1, False),
    ("off", 0.2, False),  # the deferred decode never narrows the budget
])
def test_a_deferred_decode_narrows_the_budget_unless_the_on_time_prompt_then_misses(
        late_bound: str, ttft: float, chunked: bool) -> None:
    # late_chunk 300: had "p" been given up, the background lane would take 300 of it;
    # stall_share 0: no stall rule to take it whole either
    i = inst(late="defer", late_bound=late_bound, late_chunk=300, stall_share=0.0, tile=0)
    i.add_request(req("late", 100, ttft=0.001, tbt=0.1), 0.0)
    plan, _, _ = i.schedule(0.0)
    i.complete(plan, 0.05)
    i.add_request(req("p", 400, arrival=0.05, ttft=ttft), 0.05)
    plan, _, _ = i.schedule(0.05)
    assert plan.dropped == [] and {it.request_id for it in plan.items} == {"p", "late"}
    n = chunk_of(plan, "p")

    def t(k: int) -> float:
        return PERF.predict(BatchShape(prefills=((k, 0),), decodes=(101,)))
    if chunked:  # the most the deferred decode's TBT slack allows
        assert t(n) <= 0.8 * 0.1 < t(n + 1), n
    else:
        assert n == 400


def test_idle_late_bound_leaves_a_budget_that_on_time_decodes_set() -> None:
    # an on-time decode "d" (TBT 0.5 s: a 0.4 s budget) beside the deferred one (0.1 s)
    for late_bound, narrowed in (("idle", False), ("always", True)):
        i = inst(late="defer", late_bound=late_bound)
        i.add_request(req("late", 100, ttft=0.001, tbt=0.1), 0.0)
        i.add_request(req("d", 100, tbt=0.5), 0.0)
        plan, _, _ = i.schedule(0.0)
        i.complete(plan, 0.05)
        i.add_request(req("p", 3000, arrival=0.05, ttft=2.0), 0.05)
        plan, _, _ = i.schedule(0.05)
        took = PERF.predict(BatchShape(prefills=((chunk_of(plan, "p"), 0),),
                                       decodes=(101, 101)))
        assert (took <= 0.08) is narrowed and took <= 0.4


def decoding_for(iterations: int, *young: str, ttft: float = 0.35, long_gaps: int = 0,
                 **knobs: object) -> tuple[Instance, float]:
    """A decode ("d", TBT SLO 0.1 s) that ran ``iterations`` 10 ms iterations (its mean
    TBT far under its SLO: time banked), beside decodes ``young`` that just got their
    first token; then a prompt ("p", 1,500 tokens, TTFT ``ttft``) arrives. With 0.35 s:
    alone its prefill is predicted at 0.31 s; in chunks of the TBT budget (~330 tokens
    per 0.08 s) it needs five iterations, 0.4 s: it makes its TTFT only whole. Returns
    the instance and the time."""
    i = inst(late="drop", **knobs)
    i.add_request(req("d", 100, output=5000), 0.0)
    plan, _, _ = i.schedule(0.0)
    t = 0.0
    for k in range(iterations):
        if k == iterations - 1:
            for rid in young:
                i.add_request(req(rid, 10, output=5000, arrival=t), t)
        plan, _, _ = i.schedule(t)
        t += 0.15 if 0 < k <= long_gaps else 0.01  # d's first ``long_gaps`` gaps: 0.15 s
        i.complete(plan, t)
    i.add_request(req("p", 1500, arrival=t, ttft=ttft), t)
    return i, t


@pytest.mark.parametrize("iterations,share,whole", [
    (600, 0.002, True),  # 600 gaps so far: one stretched gap is within 0.2 %
    (400, 0.002, False),  # 400 gaps: one more would pass 0.2 % of them
    (600, 0.0, False),  # stall_share 0: never
])
def test_a_prompt_that_makes_its_ttft_only_whole_stalls_decodes_that_banked_time(
        iterations: int, share: float, whole: bool) -> None:
    # alone_tight 0: at 0.35 s its TTFT is tight (under 2 x 0.31 s alone), and beside the
    # decode within 1.2 x: the rule for tight prompts would run it alone (tested below)
    i, t = decoding_for(iterations, stall_share=share, alone_tight=0.0)
    plan, _, _ = i.schedule(t)
    if whole:
        assert chunk_of(plan, "p") == 1500 and chunk_of(plan, "d") == 1
        assert plan.dropped == []
    else:
        assert plan.dropped == ["p"]  # chunks miss its TTFT: given up (late="drop")


@pytest.mark.parametrize("long_gaps,tail_tbt,whole", [
    (0, None, True),  # 2,000 gaps, none long: the stall's one is within 0.1 %
    (2, None, False),  # two gaps seen past the 0.1 s TBT SLO (a slow GPU, say) + the stall's
    (2, 0.2, True),  # judged against a 0.2 s tail, the 0.15 s gaps are not past it
])
def test_gaps_seen_past_the_tail_whatever_made_them_spend_the_stall_budget(
        long_gaps: int, tail_tbt: float | None, whole: bool) -> None:
    i, t = decoding_for(2000, long_gaps=long_gaps, stall_share=0.001, alone_tight=0.0,
                        tail_tbt=tail_tbt)
    plan, _, _ = i.schedule(t)
    if whole:
        assert chunk_of(plan, "p") == 1500 and plan.dropped == []
    else:
        assert plan.dropped == ["p"]


def test_tail_tbt_defaults_to_the_deployments_tbt_slo() -> None:
    assert SlackConfig().resolved(tbt_slo=0.1875, slo_mix="hetero").tail_tbt == 0.1875
    assert SlackConfig(tail_tbt=0.3).resolved(tbt_slo=0.1).tail_tbt == 0.3
    assert SlackConfig().resolved(tbt_slo=None).tail_tbt is None  # each request's own
    with pytest.raises(ValueError, match="tail_tbt"):
        SlackConfig(tail_tbt=0.0)


def test_no_stall_while_a_decode_has_banked_no_time() -> None:
    # "y" has one token: its mean TBT after a 0.31 s iteration would be 0.31 s > 0.1 s
    # (1,100 gaps: the two stretched ones would be within 0.2 %)
    i, t = decoding_for(1100, "y", stall_share=0.002)
    plan, _, _ = i.schedule(t)
    assert plan.dropped == ["p"]


def test_no_stall_when_chunks_make_the_ttft() -> None:
    i, t = decoding_for(600, ttft=5.0, stall_share=0.002)  # ample time in chunks
    plan, _, _ = i.schedule(t)
    assert 0 < chunk_of(plan, "p") < 1500


def old_decodes_then(prompt: int, ttft: float, **knobs: object) -> tuple[Instance, float]:
    """40 decodes (TBT SLO 0.1 s) that ran 600 10-ms iterations (time banked; 24,000 gaps
    planned), then a prompt "p" of ``prompt`` tokens with TTFT SLO ``ttft`` arrives. On the
    linear model each decode beside it adds 0.2 ms: 1,500 tokens take 0.310 s alone and
    0.318 s beside the 40."""
    i = inst(late="drop", **knobs)
    for k in range(40):
        i.add_request(req(f"d{k}", 100, output=5000, ttft=5.0), 0.0)
    t = 0.0
    for _ in range(600):
        plan, _, _ = i.schedule(t)
        t += 0.01
        i.complete(plan, t)
    i.add_request(req("p", prompt, arrival=t, ttft=ttft), t)
    return i, t


@pytest.mark.parametrize("prompt,ttft", [
    (1500, 0.315),  # needs a stall: chunks miss, whole beside the decodes 0.318 s > 0.315
    (200, 0.055),  # fits the budget: 0.058 s beside the decodes, 0.050 s alone
])
def test_a_tight_prompt_the_decodes_would_make_late_runs_alone(prompt: int, ttft: float
                                                              ) -> None:
    i, t = old_decodes_then(prompt, ttft)
    plan, _, _ = i.schedule(t)
    assert [(it.request_id, it.num_tokens) for it in plan.items] == [("p", prompt)]
    assert plan.dropped == [] and plan.preempted == []  # the decodes only wait
    t2 = t + PERF.predict(BatchShape(prefills=((prompt, 0),)))
    assert t2 - t <= ttft
    i.complete(plan, t2)
    plan, _, _ = i.schedule(t2)
    assert {it.request_id for it in plan.items} >= {f"d{k}" for k in range(40)}


@pytest.mark.parametrize("knobs", [
    {"alone_tight": 1.0},  # TTFT SLO 0.315 s >= 1.0 x 0.310 s alone: not tight
    {"alone_tight": 0.0},  # the rule off
    {"stall_share": 0.001},  # 40 stretched gaps would pass 0.1 % of 24,040
])
def test_no_prompt_alone_unless_tight_and_within_the_stall_bound(knobs: dict[str, object]
                                                                 ) -> None:
    i, t = old_decodes_then(1500, 0.315, **knobs)
    plan, _, _ = i.schedule(t)
    assert plan.dropped == ["p"]  # late="drop": beside the decodes it misses


def test_a_tight_prompt_that_makes_it_beside_the_decodes_does_not_stall_them() -> None:
    # tight (0.09 s < 2 x 0.050 s alone), and 1.2 x 0.058 s beside the decodes is in time
    i, t = old_decodes_then(200, 0.09)
    plan, _, _ = i.schedule(t)
    assert chunk_of(plan, "p") == 200 and chunk_of(plan, "d0") == 1


def test_the_gap_a_prompt_alone_stretches_includes_the_decodes_own_iteration() -> None:
    # 400 tokens: 0.090 s alone, within the decodes' 0.1 s TBT SLO; but their tokens come
    # only after their own iteration too (0.018 s): 40 gaps past their SLO, more than
    # 0.1 % of 24,040 allows
    i, t = old_decodes_then(400, 0.1, stall_share=0.001)
    plan, _, _ = i.schedule(t)
    assert plan.dropped == ["p"]


# --- the first token comes when its iteration ends --------------------------------------


def urgent_then_loose(**knobs: object) -> Instance:
    """No decode (whole prompts): "a" (1,000 tokens, TTFT 0.3 s: 0.21 s alone) and "b"
    (3,000 tokens, TTFT 5 s) wait at t = 0. Both whole would take 0.81 s, and "a"'s first
    token would come only then. "a" has no TBT SLO, so its decode leaves "b" a whole budget
    next."""
    i = inst(**knobs)
    i.add_request(req("a", 1000, ttft=0.3, tbt=None), 0.0)
    i.add_request(req("b", 3000, ttft=5.0), 0.0)
    return i


@pytest.mark.parametrize("cap", [1.2, 1.0])
def test_work_after_a_completing_prompt_stops_where_its_first_token_would_be_late(
        cap: float) -> None:
    i = urgent_then_loose(first_token_cap=cap)
    plan, _, _ = i.schedule(0.0)
    assert chunk_of(plan, "a") == 1000
    n = chunk_of(plan, "b")

    def t(k: int) -> float:
        return cap * PERF.predict(BatchShape(prefills=((1000, 0), (k, 0))))
    assert t(n) <= 0.3 < t(n + 1), n  # the most of "b" that keeps "a"'s first token in time
    end = PERF.predict(plan.shape())
    i.complete(plan, end)
    assert i.requests["a"].ttft is not None and i.requests["a"].ttft <= 0.3
    plan, _, _ = i.schedule(end)
    assert chunk_of(plan, "b") == 3000 - n  # the rest of "b" next


def test_without_the_first_token_cap_the_iteration_takes_everything() -> None:
    i = urgent_then_loose(first_token_cap=0.0)
    plan, _, _ = i.schedule(0.0)
    assert chunk_of(plan, "b") == 3000  # and "a"'s first token at 0.81 s, past 0.3 s


def test_a_prompt_late_anyway_does_not_cap_its_iteration() -> None:
    i = inst()
    view = i.view(0.0)
    shape = BatchShape(prefills=((1000, 0),))  # 0.21 s
    assert first_token_room(view, shape, 0.2, 1.2, 5000) is None
    assert first_token_room(view, shape, 0.31, 1.2, 5000) == 241  # 1.2 x 0.2582 s <= 0.31
    assert first_token_room(view, shape, 0.31, 1.2, 100) == 100  # at most what is left


# --- the two scheduling rules as functions ---------------------------------------------


def run_ends(order: list[tuple[float, float, str]], start: float) -> list[float]:
    t, ends = start, []
    for _, cost, _ in order:
        t += cost
        ends.append(t)
    return ends


def smith_jobs(raw: list[tuple[float, float]]) -> list[tuple[float, float, Request]]:
    """``(deadline, cost)`` pairs as one-machine jobs in deadline order."""
    return sorted(((d, c, Request(f"r{k}", 0.0, 1, 1, SLO(ttft=1.0)))
                   for k, (d, c) in enumerate(raw)), key=lambda j: j[0])


jobs_st = st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.01, 1.0)), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(jobs_st)
def test_smith_order_keeps_every_deadline_edf_keeps_and_never_costs_more(
        raw: list[tuple[float, float]]) -> None:
    jobs = smith_jobs(raw)
    order = smith_order(jobs, 0.0)  # type: ignore[arg-type]
    assert sorted(r.request_id for r in order) == sorted(j[2].request_id for j in jobs)
    by_id = {j[2].request_id: j for j in jobs}
    smith = [(by_id[r.request_id][0], by_id[r.request_id][1], r.request_id) for r in order]
    edf = [(d, c, r.request_id) for d, c, r in jobs]
    edf_ends, smith_ends = run_ends(edf, 0.0), run_ends(smith, 0.0)
    if all(e <= d for e, (d, _, _) in zip(edf_ends, edf, strict=True)):
        assert all(e <= d + 1e-9 for e, (d, _, _) in zip(smith_ends, smith, strict=True))
        assert sum(smith_ends) <= sum(edf_ends) + 1e-9
        # optimal: no feasible permutation has a smaller total completion time
        best = min(sum(run_ends(list(p), 0.0)) for p in itertools.permutations(edf)
                   if all(e <= d for e, (d, _, _) in zip(run_ends(list(p), 0.0), p,
                                                          strict=True)))
        assert sum(smith_ends) <= best + 1e-9


@settings(max_examples=300, deadline=None)
@given(jobs_st, st.sampled_from([0.1, 0.5, 1.0, 3.0]))
def test_smith_margin_keeps_every_deadline_edf_keeps_with_the_work_stretched(
        raw: list[tuple[float, float]], margin: float) -> None:
    # with every cost stretched by 1 + margin (a prediction that much too optimistic), the
    # margin's order still meets every deadline that EDF's order meets; margin 0 does not
    # promise this (Smith's rule puts a long job exactly at its deadline)
    jobs = smith_jobs(raw)
    order = smith_order(jobs, 0.0, margin)  # type: ignore[arg-type]
    by_id = {j[2].request_id: j for j in jobs}
    stretched = [(by_id[r.request_id][0], by_id[r.request_id][1] * (1 + margin), r.request_id)
                 for r in order]
    edf = [(d, c * (1 + margin), r.request_id) for d, c, r in jobs]
    if all(e <= d for e, (d, _, _) in zip(run_ends(edf, 0.0), edf, strict=True)):
        assert all(e <= d + 1e-9 for e, (d, _, _) in
                   zip(run_ends(stretched, 0.0), stretched, strict=True))


@settings(max_examples=200, deadline=None)
@given(jobs_st)
def test_a_huge_smith_margin_is_edf(raw: list[tuple[float, float]]) -> None:
    jobs = smith_jobs(raw)
    order = smith_order(jobs, 0.0, 1e9)  # type: ignore[arg-type]
    assert [r.request_id for r in order] == [j[2].request_id for j in jobs]


@pytest.mark.parametrize(("margin", "long_goes"), [(0.0, "last"), (1.0, "first")])
def test_smith_margin_keeps_a_long_prompt_from_its_deadline_edge(
        margin: float, long_goes: str) -> None:
    # a 0.8 s prompt due at 1.0 s, two 0.05 s prompts due at 2 s: Smith's rule runs the
    # short ones first, ending the long one at 0.9 s (0.1 s to spare); with margin 1 the
    # long one may end last only if 2 x 0.9 s <= 1.0 s, so it goes first
    mk = [(1.0, 0.8, Request("long", 0.0, 1, 1, SLO(ttft=1.0))),
          (2.0, 0.05, Request("a", 0.0, 1, 1, SLO(ttft=2.0))),
          (2.0, 0.05, Request("b", 0.0, 1, 1, SLO(ttft=2.0)))]
    order = [r.request_id for r in smith_order(mk, 0.0, margin)]
    assert order.index("long") == (2 if long_goes == "last" else 0)


@settings(max_examples=300, deadline=None)
@given(jobs_st)
def test_moore_hodgson_keeps_the_most_jobs_on_time(raw: list[tuple[float, float]]) -> None:
    jobs = smith_jobs(raw)
    kept, late = moore_hodgson(jobs, 0.0)  # type: ignore[arg-type]
    assert len(kept) + len(late) == len(jobs)
    assert all(e <= d + 1e-9 for e, (d, _, _) in zip(run_ends(kept, 0.0), kept, strict=True))
    # no subset larger than ``kept`` is feasible (checked in EDF order, which is optimal)
    for size in range(len(kept) + 1, len(jobs) + 1):
        for sub in itertools.combinations(jobs, size):
            ends = run_ends(list(sub), 0.0)
            assert not all(e <= d for e, (d, _, _) in zip(ends, sub, strict=True))


@pytest.mark.parametrize("in_budget", [False, True])
def test_a_deferred_decode_sets_the_budget_only_with_late_in_budget(in_budget: bool) -> None:
    # "late" never could make its TTFT: deferred, prefilled in the background, now decoding
    # with a 0.1 s TBT SLO. With late_bound off an on-time prompt then gets the whole budget,
    # as with no decode; with late_in_budget the deferred decode's next-token deadline sets
    # it, as an on-time decode's would (it missed its TTFT, not its TBT).
    i = inst(late="defer", late_in_budget=in_budget, late_bound="off", tile=0)
    i.add_request(req("late", 100, ttft=0.001), 0.0)
    plan, _, _ = i.schedule(0.0)
    assert chunk_of(plan, "late") == 100
    i.complete(plan, 0.05)
    i.add_request(req("p", 3000, arrival=0.05, ttft=2.0), 0.05)
    plan, _, _ = i.schedule(0.05)
    n = chunk_of(plan, "p")
    assert chunk_of(plan, "late") == 1

    def t(k: int) -> float:
        return PERF.predict(BatchShape(prefills=((k, 0),), decodes=(100,)))
    if in_budget:
        assert t(n) <= 0.8 * 0.1 < t(n + 1), n
    else:
        assert n == 3000
    # an on-time decode in its place always limits it
    j = with_decode(0.1, 0.0)
    j.add_request(req("p", 3000, arrival=0.9, ttft=2.0), 1.0)
    plan, _, _ = j.schedule(1.0)
    assert chunk_of(plan, "p") < 3000
