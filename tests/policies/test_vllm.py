"""vLLM baseline: FCFS, prefill-first, whole prompts, never a mixed batch."""

from __future__ import annotations

from helpers import make_instance, req, run_until_done


def test_batches_are_prefill_only_or_decode_only() -> None:
    inst = make_instance("vllm")
    for i in range(8):
        inst.add_request(req(f"r{i}", 30 + i, output=6, arrival=0.001 * i), 0.0)
    plans = run_until_done(inst)
    for p in plans:
        kinds = {i.is_prefill for i in p.items}
        assert len(kinds) == 1, f"mixed batch {p.items}"


def test_prefill_is_prioritised_over_running_decodes() -> None:
    inst = make_instance("vllm")
    inst.add_request(req("a", 20, output=50), 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)
    inst.add_request(req("b", 20, output=50, arrival=0.01), 0.01)
    plan, _, _ = inst.schedule(0.01)
    assert [i.request_id for i in plan.items] == ["b"]  # a's decode waits: a generation stall
    assert plan.items[0].num_tokens == 20  # whole prompt, no chunking


def test_admission_is_fcfs_and_respects_max_num_seqs() -> None:
    inst = make_instance("vllm", max_num_seqs=3)
    for i in range(5):
        inst.add_request(req(f"r{i}", 10, output=3, arrival=float(i)), float(i))
    plan, _, _ = inst.schedule(5.0)
    assert [i.request_id for i in plan.items] == ["r0", "r1", "r2"]


def test_fcfs_does_not_skip_a_head_request_that_does_not_fit() -> None:
    inst = make_instance("vllm", max_num_batched_tokens=100)
    inst.add_request(req("big", 90, output=2), 0.0)
    inst.add_request(req("next", 50, output=2, arrival=0.1), 0.1)
    plan, _, _ = inst.schedule(0.2)
    assert [i.request_id for i in plan.items] == ["big"]
