"""Sarathi-Serve: stall-free batching within a token budget (OSDI'24 §4)."""

from __future__ import annotations

from helpers import make_instance, req
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=40, deadline=None)
@given(
    budget=st.sampled_from([32, 64, 128, 512]),
    prompts=st.lists(st.integers(1, 700), min_size=1, max_size=12),
    outputs=st.lists(st.integers(1, 40), min_size=12, max_size=12),
)
def test_never_exceeds_budget_and_never_stalls_a_running_decode(
    budget: int, prompts: list[int], outputs: list[int]
) -> None:
    inst = make_instance("sarathi", num_blocks=4000, token_budget=budget)
    for i, p in enumerate(prompts):
        inst.add_request(req(f"r{i}", p, output=outputs[i], arrival=0.01 * i), 0.0)
    now = 0.0
    while inst.has_work:
        decodes = {r.request_id for r in inst.running if r.is_decode}
        plan, _, _ = inst.schedule(now)
        assert plan.num_tokens <= budget
        scheduled = {i.request_id for i in plan.items}
        if len(decodes) <= budget:  # enough budget for every decode: none may be stalled
            assert decodes <= scheduled | set(plan.preempted), "a running decode was stalled"
        now += 0.01
        inst.complete(plan, now)


def test_long_prompt_is_chunked_alongside_decodes() -> None:
    inst = make_instance("sarathi", token_budget=128)
    inst.add_request(req("a", 10, output=100), 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)
    inst.add_request(req("long", 1000, output=5, arrival=0.01), 0.01)
    plan, _, _ = inst.schedule(0.01)
    by_id = {i.request_id: i for i in plan.items}
    assert by_id["a"].num_tokens == 1 and not by_id["a"].is_prefill
    assert by_id["long"].num_tokens == 127  # the rest of the budget, a chunk


def test_ongoing_prefill_continues_before_new_requests_are_admitted() -> None:
    inst = make_instance("sarathi", token_budget=100)
    inst.add_request(req("first", 250, output=3), 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)
    inst.add_request(req("second", 50, output=3, arrival=0.01), 0.01)
    plan, _, _ = inst.schedule(0.01)
    assert [(i.request_id, i.num_tokens) for i in plan.items] == [("first", 100)]
    inst.complete(plan, 0.02)
    plan, _, _ = inst.schedule(0.02)
    assert [(i.request_id, i.num_tokens) for i in plan.items] == [("first", 50), ("second", 50)]
