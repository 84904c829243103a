"""vLLM baseline: FCFS, prefill-first, whole prompts, never a mixed batch."""

from __future__ import annotations

from helpers import make_instance, req, run_until_done

from sloserve.controller import Drop
from sloserve.policies.vllm import VllmConfig
from sloserve.request import RequestStatus
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation


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


def test_prompt_over_max_num_batched_tokens_is_ignored_and_fcfs_goes_on() -> None:
    inst = make_instance("vllm", max_num_batched_tokens=100)
    long, short = req("long", 150, output=2), req("short", 50, output=2, arrival=0.1)
    inst.add_request(long, 0.0)
    inst.add_request(short, 0.1)
    plan, _, dropped = inst.schedule(0.2)
    assert [i.request_id for i in plan.items] == ["short"]
    assert plan.dropped == ["long"] and dropped == [long]
    assert long.status is RequestStatus.DROPPED and long.finish_time == 0.2
    assert long.drop_reason == "Input prompt (150 tokens) is too long and exceeds limit of 100"
    assert inst.kv.num_blocks_of("long") == 0


def test_ignored_request_reaches_the_client_with_vllms_reason_in_simulation() -> None:
    # 20 prompts over the cap: before the fix the queue blocked forever (0 iterations)
    cfg = SimConfig(policy="vllm", trace=None, fixed_lengths=(300, 4), num_requests=20,
                    qps=5.0, policy_config=VllmConfig(max_num_batched_tokens=256),
                    record_decisions=True)
    sim = Simulation(cfg)
    out = sim.run()
    assert out["dropped"] == 20 and out["completed"] == 0
    assert all(r.status is RequestStatus.DROPPED for r in sim.workload.requests)
    drops = [a for a in sim.controller.decisions or [] if isinstance(a, Drop)]
    assert len(drops) == 20
    assert all(a.reason.endswith("is too long and exceeds limit of 256") for a in drops)


def test_prompt_that_can_never_fit_the_kv_cache_is_ignored() -> None:
    # 200 blocks, 1% watermark = 2 blocks: a prompt needing 199 blocks can never be admitted
    inst = make_instance("vllm", num_blocks=200, block_size=16)
    big, small = req("big", 199 * 16, output=1), req("small", 20, output=1, arrival=0.1)
    inst.add_request(big, 0.0)
    inst.add_request(small, 0.1)
    plan, _, _ = inst.schedule(0.2)
    assert [i.request_id for i in plan.items] == ["small"] and plan.dropped == ["big"]
    assert big.drop_reason is not None and "capacity of block_manager" in big.drop_reason


def test_kv_shortage_preempts_the_latest_arrival_not_the_latest_admitted() -> None:
    # "late" is queued (and so admitted) before "early": vLLM evicts by arrival
    inst = make_instance("vllm", num_blocks=4, block_size=4)
    late, early = req("late", 6, output=8, arrival=5.0), req("early", 6, output=8, arrival=1.0)
    inst.add_request(late, 5.0)
    inst.add_request(early, 5.0)
    plans = run_until_done(inst)
    first = next(p for p in plans if p.preempted)
    assert first.preempted == ["late"]
    assert early.num_preemptions == 0


def test_preempted_requests_are_readmitted_in_arrival_order() -> None:
    # four one-block requests fill 4 blocks; their second blocks evict the two latest arrivals
    inst = make_instance("vllm", num_blocks=4, block_size=4)
    rs = [req(f"r{i}", 4, output=3, arrival=float(i)) for i in range(4)]
    for r in rs:
        inst.add_request(r, 4.0)
    plan, _, _ = inst.schedule(4.0)
    inst.complete(plan, 4.01)  # four prompts prefilled: every block used
    plan, _, _ = inst.schedule(4.01)
    assert plan.preempted == ["r3", "r2"]
    assert [r.request_id for r in inst.waiting] == ["r2", "r3"]


def test_an_ignored_prompt_leaves_with_the_decode_batch_of_running_requests() -> None:
    inst = make_instance("vllm", max_num_batched_tokens=100)
    inst.add_request(req("a", 20, output=5), 0.0)
    plan, _, _ = inst.schedule(0.0)
    inst.complete(plan, 0.01)
    long = req("long", 101, output=2, arrival=0.01)
    inst.add_request(long, 0.01)
    plan, _, dropped = inst.schedule(0.01)
    assert [(i.request_id, i.is_prefill) for i in plan.items] == [("a", False)]
    assert dropped == [long] and plan.drop_reasons == {
        "long": "Input prompt (101 tokens) is too long and exceeds limit of 100"}
