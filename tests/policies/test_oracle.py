"""Output-length oracle (AccelGen §6.1's Oracle, online stand-in): SRPT on true lengths."""

from __future__ import annotations

from sloserve.batch import BatchPlan
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.accelgen_pivot import measure_pivot
from sloserve.policies.oracle import OracleConfig, OraclePolicy
from sloserve.request import Request

PM = LinearPerfModel()


def make(num_blocks: int = 10_000, block_size: int = 16, **knobs: int) -> Instance:
    return Instance("i0", OraclePolicy(OracleConfig(**knobs)),
                    BlockManager(num_blocks, block_size), PM)


def step(inst: Instance, now: float) -> tuple[BatchPlan, float]:
    plan, _, _ = inst.schedule(now)
    end = now + PM.predict(plan.shape())
    inst.complete(plan, end)
    return plan, end


def tokens_of(plan: BatchPlan) -> dict[str, int]:
    return {i.request_id: i.num_tokens for i in plan.items}


def test_shortest_true_output_goes_first_not_fcfs() -> None:
    inst = make(token_budget=300)
    inst.add_request(Request("early-long-output", 0.0, 200, 2000), 0.0)
    inst.add_request(Request("late-short-output", 0.1, 200, 5), 0.1)
    plan, _ = step(inst, 0.2)
    assert tokens_of(plan) == {"late-short-output": 200, "early-long-output": 100}


def test_kv_shortage_preempts_the_request_with_most_work_left() -> None:
    # 12 blocks of 4 tokens: two requests of 8 prompt tokens grow until KV runs out
    inst = make(num_blocks=12, block_size=4, token_budget=64)
    inst.add_request(Request("short-left", 0.0, 8, 30), 0.0)
    _, now = step(inst, 0.0)
    inst.add_request(Request("long-left", now, 8, 40), now)  # admitted last
    preempted: list[str] = []
    while not preempted:
        plan, now = step(inst, now)
        preempted = plan.preempted
    assert preempted == ["long-left"]
    # and when the longer job was admitted first, it is still the victim (vLLM: the latest)
    inst = make(num_blocks=12, block_size=4, token_budget=64)
    inst.add_request(Request("long-left", 0.0, 8, 40), 0.0)
    _, now = step(inst, 0.0)
    inst.add_request(Request("short-left", now, 10, 30), now)  # it needs the next block
    preempted = []
    while not preempted:
        plan, now = step(inst, now)
        preempted = plan.preempted
    assert preempted == ["long-left"]


def test_unset_budget_is_the_measured_pivot() -> None:
    inst = make()
    inst.add_request(Request("r", 0.0, 20_000, 5), 0.0)
    plan, _ = step(inst, 0.0)
    assert plan.num_tokens == measure_pivot(PM.predict)
