"""An instance with prefix caching prefills only a request's uncached tokens."""

from __future__ import annotations

from helpers import make_policy, req, run_until_done

from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.kv_prefix import PREFIX_UNIT, PrefixCachingBlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.base import BatchBuilder
from sloserve.request import SLO, Request, RequestStatus


def caching_instance(policy: str = "sarathi", num_blocks: int = 1000, **knobs: object) -> Instance:
    return Instance("lp0", make_policy(policy, **knobs),
                    PrefixCachingBlockManager(num_blocks, 16), LinearPerfModel())


def turn(rid: str, prompt: int, ids: tuple[int, ...], arrival: float = 0.0) -> Request:
    return Request(rid, arrival, prompt, 4, SLO(ttft=1.0, tbt=0.1), hash_ids=ids)


def test_a_request_with_a_hit_prefills_only_its_uncached_tokens() -> None:
    inst = caching_instance(token_budget=4096)
    first = turn("t1", PREFIX_UNIT + 100, (1, 2))
    inst.add_request(first, 0.0)
    run_until_done(inst)
    assert first.status is RequestStatus.FINISHED
    second = turn("t2", 2 * PREFIX_UNIT + 50, (1, 2, 3))
    inst.add_request(second, 1.0)
    hit = (PREFIX_UNIT + 100 + 3) // 16 * 16  # t1's prompt and its first 3 outputs, full blocks
    assert second.num_computed == second.num_cached == hit  # policies see the uncached length
    assert second.num_uncomputed == second.prompt_len - hit
    assert not second.prefill_started
    plan, _, _ = inst.schedule(1.0)
    (item,) = plan.items
    assert (item.context_len, item.num_tokens) == (hit, second.prompt_len - hit)
    assert plan.shape().prefills == ((second.prompt_len - hit, hit),)  # the perf model's view
    kv = inst.kv
    assert isinstance(kv, PrefixCachingBlockManager)
    assert kv.num_hit_tokens == hit
    assert kv.num_query_tokens == first.prompt_len + second.prompt_len
    inst.complete(plan, 1.01)
    run_until_done(inst)
    assert second.num_generated == second.output_len
    assert kv.num_free_blocks == kv.num_blocks  # everything released, some still cached
    assert kv.num_cached_blocks > 0


def test_a_waiting_request_holds_no_blocks_for_its_hit_until_admitted() -> None:
    inst = caching_instance(token_budget=4096)
    inst.add_request(turn("a", 600, (1, 2)), 0.0)
    run_until_done(inst)
    b = turn("b", 700, (1, 2))
    inst.add_request(b, 1.0)
    assert b.num_cached > 0
    assert inst.kv.num_blocks_of("b") == 0
    assert inst.kv.num_free_blocks == inst.kv.num_blocks
    inst.cancel("b", 1.0)
    assert (b.num_computed, b.num_cached) == (0, 0)  # a hit is not carried away


def test_without_prefix_identity_the_caching_manager_changes_no_plan() -> None:
    def plans(kv: BlockManager) -> list[object]:
        inst = Instance("lp0", make_policy("vllm"), kv, LinearPerfModel())
        for i in range(12):
            inst.add_request(req(f"r{i}", prompt=40 + 17 * i, output=9, arrival=0.0), 0.0)
        return [(p.items, p.preempted) for p in run_until_done(inst)]

    # tight KV, so preemption happens too
    assert plans(PrefixCachingBlockManager(60, 4)) == plans(BlockManager(60, 4))


def test_preempted_shared_request_keeps_the_others_blocks_and_all_finish() -> None:
    inst = caching_instance("vllm", num_blocks=60)
    rs = [turn(f"r{i}", 300 + 40 * i, (7, 100 + i), arrival=0.0) for i in range(6)]
    for r in rs:
        r.output_len = 400
        inst.add_request(r, 0.0)
    run_until_done(inst)
    assert inst.num_preemptions > 0
    assert all(r.status is RequestStatus.FINISHED for r in rs)
    assert inst.kv.num_free_blocks == inst.kv.num_blocks


def test_preempting_a_sharer_counts_only_the_blocks_it_alone_holds() -> None:
    inst = caching_instance(token_budget=4096)
    a, b = turn("a", 2 * PREFIX_UNIT, (5, 6)), turn("b", 2 * PREFIX_UNIT, (5, 6))
    inst.add_request(a, 0.0)
    inst.complete(inst.schedule(0.0)[0], 0.01)  # a prefilled: its blocks cached
    inst.add_request(b, 0.02)
    inst.complete(inst.schedule(0.02)[0], 0.03)  # b shares all but its last block
    builder = BatchBuilder(inst.view(0.04), token_budget=4096, max_num_seqs=8)
    before = builder.free_blocks
    builder.preempt(b)
    assert builder.free_blocks - before == 1  # its last block: the hit stops at prompt - 1
