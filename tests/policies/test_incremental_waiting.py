"""Ascendra's LP queue and the oracle's SRPT order sync incrementally, deciding exactly
as a full reconciliation (a stable sort of the waiting queue).

Issue 14 (incremental decisions): the LP keys only the requests that joined its
waiting queue (arrivals, preemptions, a lost executor's requeue) instead of scanning
the whole queue every iteration. Two instances run the same workload side by side:
one as built, one whose queue reconciles the whole waiting queue at every sync (the
behaviour before). Their plans must be identical at every
iteration, through ties (equal keys), preemptions, cancels of waiting requests, a
refit of the perf model (a re-key) and a lost executor, while the incremental one
scans the whole queue only on those events.
"""

from __future__ import annotations

import random

import pytest

from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.policies.ascendra import AscendraConfig
from sloserve.policies.ascendra_lp import AscendraLPPolicy
from sloserve.policies.base import Policy
from sloserve.policies.oracle import OracleConfig, OraclePolicy
from sloserve.request import SLO, Request


def _instance(name: str, incremental: bool) -> tuple[Instance, Policy]:
    spec = get_spec(name)
    if name == "ascendra":
        policy = spec.make("lp", AscendraConfig(token_budget=256, offload_threshold=0.0))
        assert isinstance(policy, AscendraLPPolicy)
        policy.queue.incremental = incremental  # False: the full reconciliation every time
    else:
        policy = spec.make("lp", OracleConfig(token_budget=256))
        assert isinstance(policy, OraclePolicy)
        policy.order.incremental = incremental  # False: the stable sort's order every time
    perf = LinearPerfModel(base=0.005, per_token=0.0001, per_ctx=0.0)
    return Instance("lp0", policy, BlockManager(160, 16), perf), policy


def _plan_record(plan: object) -> tuple[object, ...]:
    return (tuple(plan.items), tuple(plan.preempted),  # type: ignore[attr-defined]
            tuple(plan.offloaded), tuple(plan.dropped))  # type: ignore[attr-defined]


def _full_syncs(policy: Policy) -> int:
    if isinstance(policy, AscendraLPPolicy):
        return policy.queue.num_full_syncs
    assert isinstance(policy, OraclePolicy)
    return policy.order.num_rebuilds


@pytest.mark.parametrize("name", ["ascendra", "oracle"])
def test_incremental_sync_gives_the_full_reconciliations_plans(name: str) -> None:
    rng = random.Random(7)
    twins = [_instance(name, True), _instance(name, False)]
    now, next_id, iterations = 0.0, 0, 0
    for step in range(600):
        if step < 400 and rng.random() < 0.6:  # arrivals in bursts: equal arrival times tie
            for _ in range(rng.choice((1, 1, 3))):
                prompt, out = rng.choice((64, 64, 200)), rng.randint(4, 40)
                ttft = rng.choice((0.5, 1.0, 2.0))
                for inst, _ in twins:
                    inst.add_request(Request(f"r{next_id}", now, prompt, out,
                                             SLO(ttft=ttft, tbt=None)), now)
                next_id += 1
        if step % 37 == 5:  # a waiting request is cancelled (behind the queue's back)
            waiting = list(twins[0][0].waiting)
            if waiting:
                victim = rng.choice(waiting).request_id
                for inst, _ in twins:
                    inst.cancel(victim, now)
        if step == 300:  # the perf model is refitted: every key changes
            for inst, _ in twins:
                inst.perf_model = LinearPerfModel(base=0.004, per_token=0.0003, per_ctx=0.0)
        if step == 450:  # the executor is lost: running requests go back to recompute
            for inst, _ in twins:
                inst.preempt_all()
        plans: list[tuple[object, ...] | None] = []
        for inst, _ in twins:
            if not inst.has_work:
                plans.append(None)
                continue
            plan, _, _ = inst.schedule(now)
            plans.append(_plan_record(plan))
            inst.complete(plan, now + 0.01)
        assert plans[0] == plans[1], f"step {step}"
        for _, policy in twins:  # the offload scan's bound, kept as entries come and go
            if isinstance(policy, AscendraLPPolicy):
                q = policy.queue
                assert q.max_prefill_time() == max(
                    (e[3] for e in q._live.values()), default=0.0)
        iterations += plans[0] is not None
        now += 0.01
    assert twins[0][0].num_preemptions > 0  # the policy's own and the lost executor's
    assert _full_syncs(twins[1][1]) == iterations
    # full scans only at the first sync, cancels, the refit and the loss (+ a few cancels'
    # stale entries), not every iteration
    assert _full_syncs(twins[0][1]) < iterations // 10
