"""Instance applies plans and results with vLLM's token accounting."""

from __future__ import annotations

import pytest
from helpers import make_instance, req, run_until_done

from sloserve.request import RequestStatus


def test_every_request_gets_exactly_its_output_tokens_and_frees_its_blocks() -> None:
    inst = make_instance("sarathi", token_budget=64)
    rs = [req(f"r{i}", prompt=50 + 13 * i, output=5 + i) for i in range(6)]
    for r in rs:
        inst.add_request(r, 0.0)
    run_until_done(inst)
    for r in rs:
        assert r.status is RequestStatus.FINISHED
        assert r.num_generated == r.output_len == len(r.token_times)
    assert inst.kv.num_free_blocks == inst.kv.num_blocks


def test_preempted_request_recomputes_prompt_and_generated_tokens() -> None:
    # 4 blocks of 4 tokens: two requests of 6 prompt tokens fill 4 blocks after a few decodes.
    inst = make_instance("vllm", num_blocks=4, block_size=4)
    a, b = req("a", 6, output=6), req("b", 6, output=6, arrival=0.1)
    inst.add_request(a, 0.0)
    inst.add_request(b, 0.1)
    plans = run_until_done(inst)
    assert inst.num_preemptions >= 1
    assert b.num_preemptions >= 1 and a.num_preemptions == 0  # the latest admitted is the victim
    recompute = [i for p in plans for i in p.items if i.request_id == "b" and i.is_prefill]
    assert any(i.num_tokens > 6 for i in recompute), "recompute covers generated tokens too"
    assert a.num_generated == b.num_generated == 6


def test_request_larger_than_kv_is_rejected_on_arrival() -> None:
    inst = make_instance("vllm", num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="KV capacity"):
        inst.add_request(req("big", 8, output=4), 0.0)
    assert not inst.has_work


def test_cancel_frees_blocks_and_removes_everywhere() -> None:
    inst = make_instance("sarathi", token_budget=32)
    r = req("a", 40, output=10)
    inst.add_request(r, 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)
    assert inst.kv.num_used_blocks > 0
    inst.cancel("a", 0.02)
    assert r.status is RequestStatus.CANCELLED
    assert inst.kv.num_used_blocks == 0 and not inst.has_work


def test_complete_without_every_token_reports_only_first_and_last_tokens_with_the_same_state(
) -> None:
    """The simulator's ``every_token=False``: the controller still sees every first and
    last token, and requests advance exactly as with every event built."""
    insts = [make_instance("vllm", num_blocks=8, block_size=4) for _ in range(2)]
    reqs = [[req(f"r{i}", 6 + 2 * i, output=2 + 4 * i, arrival=0.01 * i) for i in range(4)]
            for _ in insts]
    for inst, rs in zip(insts, reqs):
        for r in rs:
            inst.add_request(r, r.arrival_time)
    full, edges = [], []
    now = 0.0
    while insts[0].has_work:
        now += 0.01
        (p0, _, _), (p1, _, _) = insts[0].schedule(now), insts[1].schedule(now)
        assert p0 == p1
        full += insts[0].complete(p0, now + 0.01)
        edges += insts[1].complete(p1, now + 0.01, every_token=False)
    assert insts[0].num_preemptions > 0  # the recompute path is covered too
    assert edges == [e for e in full if e.index == 0 or e.finished]
    assert sum(e.finished for e in edges) == 4 and sum(e.index == 0 for e in edges) == 4
    for a, b in zip(*reqs):
        assert (a.token_times, a.num_generated, a.status) == (b.token_times, b.num_generated,
                                                              b.status)
