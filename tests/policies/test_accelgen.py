"""AccelGen policy (§4.2-§4.4): dynamic budget, urgency, ERA, multi-resource selection."""

from __future__ import annotations

from sloserve.batch import BatchPlan
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.accelgen import (
    AccelGenConfig,
    AccelGenPolicy,
    dynamic_token_budget,
    pivot_batch,
)
from sloserve.policies.accelgen_select import Demand, nearest_first
from sloserve.request import SLO, Request

PM = LinearPerfModel()


def make(num_blocks: int = 1000, block_size: int = 16, **knobs: object) -> Instance:
    return Instance("i0", AccelGenPolicy(AccelGenConfig(**knobs)),  # type: ignore[arg-type]
                    BlockManager(num_blocks, block_size), PM)


def policy(inst: Instance) -> AccelGenPolicy:
    assert isinstance(inst.policy, AccelGenPolicy)
    return inst.policy


def rq(rid: str, prompt: int, output: int = 50, arrival: float = 0.0, **slo: float) -> Request:
    return Request(rid, arrival, prompt, output, SLO(**slo))


def step(inst: Instance, now: float) -> tuple[BatchPlan, float]:
    """One iteration: schedule at ``now``, run for the predicted time, apply the results."""
    plan, _, _ = inst.schedule(now)
    end = now + PM.predict(plan.shape())
    inst.complete(plan, end)
    return plan, end


def tokens_of(plan: BatchPlan) -> dict[str, int]:
    return {i.request_id: i.num_tokens for i in plan.items}


def expected_budget(inst: Instance, slo_min: float | None) -> int:
    cfg = policy(inst).config
    decodes = [r for r in inst.running if r.is_decode]
    t_pf = PM.predict(pivot_batch(cfg.token_budget, decodes))
    return dynamic_token_budget(
        cfg.token_budget, slo_min, t_pf, cfg.min_token_budget, cfg.max_token_budget
    )


def test_budget_shrinks_when_tight_tbt_request_joins_and_grows_back_when_it_leaves() -> None:
    inst = make(num_blocks=2000, token_budget=512)
    inst.add_request(rq("loose", 64, output=400, ttft=5.0, tbt=0.5), 0.0)
    inst.add_request(rq("filler", 20_000, output=1), 0.0)  # best effort: keeps batches full
    now = 0.0
    for _ in range(3):
        plan, now = step(inst, now)
    loose = policy(inst).token_budget
    assert loose == expected_budget(inst, 0.5) and plan.num_tokens == loose

    inst.add_request(rq("tight", 16, output=3, arrival=now, ttft=0.5, tbt=0.06), now)
    plan, now = step(inst, now)  # tight prefills
    plan, now = step(inst, now)  # tight decodes: SLO_min = 0.06
    tight = policy(inst).token_budget
    assert tight == expected_budget(inst, 0.06) < loose
    assert plan.num_tokens == tight
    while "tight" in inst.requests:
        plan, now = step(inst, now)
    plan, now = step(inst, now)
    assert policy(inst).token_budget == expected_budget(inst, 0.5) > tight


def test_budget_is_clamped_to_min_and_max() -> None:
    for slo, want in ((1e-4, 40), (100.0, 900)):
        inst = make(token_budget=512, min_token_budget=40, max_token_budget=900)
        inst.add_request(rq("r", 5000, ttft=slo, tbt=slo), 0.0)
        _, now = step(inst, 0.0)  # waiting: its SLO is no iteration bound yet
        plan, _ = step(inst, now)  # running (in prefill): its TBT is SLO_min
        assert policy(inst).token_budget == want == plan.num_tokens
    inst = make(token_budget=512)
    inst.add_request(rq("best-effort", 5000), 0.0)
    plan, _ = step(inst, 0.0)
    assert policy(inst).token_budget == 512 == plan.num_tokens  # no SLO: S_pf itself


def test_waiting_requests_run_in_ascending_remaining_time_not_fcfs() -> None:
    inst = make(token_budget=512)
    inst.add_request(rq("early-loose", 1200, arrival=-1.0, ttft=100.0, tbt=1.0), -1.0)
    inst.add_request(rq("late-tight", 1200, arrival=0.0, ttft=0.3, tbt=1.0), 0.0)
    plan, _ = step(inst, 0.0)
    got = tokens_of(plan)
    assert got["late-tight"] == min(1200, policy(inst).token_budget)
    assert sum(got.values()) == policy(inst).token_budget


def test_urgent_request_goes_before_ongoing_non_urgent_prefill() -> None:
    inst = make(token_budget=512, max_token_budget=512, long_prompt_threshold=100_000)
    inst.add_request(rq("ongoing", 8000, ttft=100.0, tbt=1.0), 0.0)
    plan, now = step(inst, 0.0)
    assert "ongoing" in tokens_of(plan)
    # due in 0.1 s: remaining time is below T_max, so it is urgent
    inst.add_request(rq("urgent", 300, arrival=now, ttft=0.1, tbt=1.0), now)
    plan, _ = step(inst, now)
    got, b = tokens_of(plan), policy(inst).token_budget
    assert b == 512
    assert got["urgent"] == 300 and got["ongoing"] == b - 300


def test_only_one_long_prompt_in_prefill_at_a_time() -> None:
    inst = make(num_blocks=4000, token_budget=2048, max_token_budget=2048,
                long_prompt_threshold=1000)  # fmt: skip
    for i in range(3):
        inst.add_request(rq(f"long{i}", 3000, output=2, ttft=60.0, tbt=1.0), 0.0)
    inst.add_request(rq("short", 200, output=2, ttft=60.0, tbt=1.0), 0.0)
    now, started = 0.0, []
    while inst.has_work:
        plan, now = step(inst, now)
        longs = [i for i in plan.items if i.is_prefill and i.request_id.startswith("long")]
        assert len(longs) <= 1  # budget is left over, yet no second long prompt joins
        started += [i.request_id for i in plan.items if i.context_len == 0]
    assert [s for s in started if s.startswith("long")] == ["long0", "long1", "long2"]
    assert started.index("short") < started.index("long1")


def test_nearest_first_picks_demand_closest_to_available_resources() -> None:
    demands = [Demand(100, 16), Demand(60, 160), Demand(90, 128), None, Demand(10, 40)]
    # distances to (100, 160): 144, 40, 33.5, -, 90 -> index 2; then (10, 32): only index 4
    # would fit compute but needs 40 > 32 KV, so selection stops
    assert nearest_first(demands, a_c=100, a_m=160, max_picks=5) == [2]
    assert nearest_first(demands, a_c=200, a_m=400, max_picks=5)[:2] == [1, 2]
    # ERA inside selection: at most one exclusive (long) demand
    longs = [Demand(50, 50, exclusive=True), Demand(50, 50, exclusive=True)]
    assert nearest_first(longs, a_c=100, a_m=100, max_picks=5) == [0]


def test_policy_selects_request_filling_compute_and_kv_over_queue_head() -> None:
    inst = make(num_blocks=1000, token_budget=512)  # no SLO: S_b = 512, A_m = 990 blocks
    inst.add_request(rq("small", 100, arrival=0.0), 0.0)
    inst.add_request(rq("fits-budget", 500, arrival=0.1), 0.1)
    plan, _ = step(inst, 0.2)
    # FCFS would run small (100) then a 412-token chunk of fits-budget
    assert tokens_of(plan) == {"fits-budget": 500, "small": 12}


def test_running_decodes_are_never_stalled_by_a_small_budget() -> None:
    inst = make(token_budget=512, min_token_budget=8, max_token_budget=4096)
    for i in range(40):
        inst.add_request(rq(f"d{i}", 16, output=300, ttft=5.0, tbt=1.0), 0.0)
    _, now = step(inst, 0.0)
    _, now = step(inst, now)  # all 40 running
    # a request with a 1 ms TBT joins: S_b collapses to the 8-token floor
    inst.add_request(rq("tight", 4000, arrival=now, ttft=0.001, tbt=0.001), now)
    _, now = step(inst, now)  # tight starts; from now on it bounds S_b
    for _ in range(5):
        decoding = {r.request_id for r in inst.running if r.is_decode}
        plan, now = step(inst, now)
        assert policy(inst).token_budget == 8 < 40 <= len(decoding)
        assert decoding <= set(tokens_of(plan))


def test_kv_shortage_preempts_request_with_most_remaining_time() -> None:
    inst = make(num_blocks=8, block_size=4, token_budget=64)
    inst.add_request(rq("best-effort", 8, output=20), 0.0)
    _, now = step(inst, 0.0)  # admitted first
    inst.add_request(rq("tight", 8, output=20, arrival=now, ttft=5.0, tbt=0.5), now)
    preempted: list[str] = []
    while not preempted:
        plan, now = step(inst, now)
        preempted = plan.preempted
    assert preempted == ["best-effort"]  # vLLM would evict the latest admitted ("tight")


def test_batches_respect_budget_kv_and_slots_under_mixed_load() -> None:
    inst = make(num_blocks=300, block_size=16, token_budget=256, max_num_seqs=12,
                long_prompt_threshold=1500)  # fmt: skip
    kinds = [dict(ttft=1.0, tbt=0.1), dict(jct=30.0), {}, dict(ttft=2.0, tbt=0.3)]
    for i in range(60):
        inst.add_request(rq(f"r{i}", 50 + 97 * i % 2000, 5 + i % 40, i * 0.05, **kinds[i % 4]),
                         i * 0.05)  # fmt: skip
    now = 0.0
    for _ in range(3000):
        if not inst.has_work:
            break
        decodes = sum(1 for r in inst.running if r.is_decode)
        plan, now = step(inst, now)  # Instance raises if a plan over-allocates KV
        assert plan.num_tokens <= max(policy(inst).token_budget, decodes)
        assert len(plan.items) <= 12
    assert not inst.has_work
    assert not policy(inst).jct  # per-request JCT state is dropped when requests leave


def test_jct_request_carries_unused_wait_forward() -> None:
    inst = make(token_budget=512)
    inst.add_request(rq("job", 100, output=10, jct=50.0), 0.0)
    plan, now = step(inst, 0.0)
    clock = policy(inst).jct["job"]
    first = clock.slack
    assert first.carry == first.per_iteration  # batched with no wait: all of it carried
    _, _ = step(inst, now)
    assert clock.slack.carry > first.carry


def test_bad_knobs_raise_value_error_naming_the_field() -> None:
    import pytest

    with pytest.raises(ValueError, match="gamma"):
        AccelGenConfig(gamma=-1.0)
    with pytest.raises(ValueError, match="min_token_budget"):
        AccelGenConfig(min_token_budget=100, max_token_budget=50)


def test_queued_request_ttft_does_not_shrink_the_budget_running_tbt_does() -> None:
    """Eq. 6's SLO_min is over the requests in the batch (their TBT), not the queue head."""
    inst = make(num_blocks=2000, token_budget=512)
    inst.add_request(rq("loose", 64, output=400, ttft=5.0, tbt=0.5), 0.0)
    _, now = step(inst, 0.0)
    # a queued request with a tiny TTFT but a loose TBT: S_b keeps the running TBT's value
    inst.add_request(rq("quick-first", 3000, output=5, arrival=now, ttft=0.01, tbt=0.5), now)
    step(inst, now)
    assert policy(inst).token_budget == expected_budget(inst, 0.5) > 512


def test_pivot_forward_size_is_measured_where_throughput_nearly_saturates() -> None:
    from sloserve.batch import BatchShape
    from sloserve.policies.accelgen_pivot import SATURATION, measure_pivot

    def batch_time(shape: BatchShape) -> float:  # 20 ms fixed + 50 us per token
        return 0.020 + 50e-6 * shape.num_tokens

    pivot = measure_pivot(batch_time, step=64, max_tokens=8192)
    rate = [n / batch_time(BatchShape(prefills=((n, 0),))) for n in (pivot - 64, pivot, 8192)]
    assert rate[0] < SATURATION * rate[2] <= rate[1]
    # the policy measures it on its own perf model when token_budget is unset
    inst = make(num_blocks=2000)
    inst.add_request(rq("r", 100, ttft=5.0, tbt=0.5), 0.0)
    step(inst, 0.0)
    assert policy(inst).s_pf == measure_pivot(PM.predict) != 512


def test_long_prompt_is_at_least_4k_tokens_by_default() -> None:
    """ERA's long prompt (§1: >= 4K tokens): two 3K prompts prefill together, two 5K do not."""
    for prompt, together in ((3000, True), (5000, False)):
        inst = make(num_blocks=4000, token_budget=8192, max_token_budget=8192)
        for i in range(2):
            inst.add_request(rq(f"p{i}", prompt, output=2, ttft=60.0, tbt=1.0), 0.0)
        plan, _ = step(inst, 0.0)
        assert (len(plan.items) == 2) is together


def test_urgent_request_preempts_running_request_with_most_remaining_time() -> None:
    """Algorithm 1 lines 2-4: no KV for an urgent request -> evict max-T_r work from B."""
    inst = make(num_blocks=40, block_size=16, token_budget=512)
    inst.add_request(rq("best-effort", 400, output=200), 0.0)  # 25 blocks, T_r = inf
    inst.add_request(rq("online", 100, output=200, ttft=60.0, tbt=1.0), 0.0)  # 7 blocks
    _, now = step(inst, 0.0)
    assert {r.request_id for r in inst.running} == {"best-effort", "online"}
    # due now: urgent, needs 13 blocks while 8 are free (less the 1% watermark)
    inst.add_request(rq("urgent", 200, output=5, arrival=now, ttft=0.05, tbt=1.0), now)
    plan, _ = step(inst, now)
    assert plan.preempted == ["best-effort"]  # not "online": its T_r is smaller
    assert tokens_of(plan)["urgent"] == 200 and "online" in tokens_of(plan)
    assert policy(inst).num_urgent_preemptions == 1


def test_urgent_preemption_can_be_switched_off() -> None:
    inst = make(num_blocks=40, block_size=16, token_budget=512, preempt_for_urgent=False)
    inst.add_request(rq("best-effort", 400, output=200), 0.0)
    inst.add_request(rq("online", 100, output=200, ttft=60.0, tbt=1.0), 0.0)
    _, now = step(inst, 0.0)
    inst.add_request(rq("urgent", 200, output=5, arrival=now, ttft=0.05, tbt=1.0), now)
    plan, _ = step(inst, now)
    assert not plan.preempted and "urgent" not in tokens_of(plan)
