"""Ascendra §8.6: the drop-late rule given to a baseline (vLLM) for the overload comparison."""

from __future__ import annotations

from helpers import req

from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies.drop_late import with_drop_late
from sloserve.policies.vllm import VllmConfig, VllmPolicy


def test_a_baseline_with_drop_late_drops_waiting_requests_past_ttft_and_runs_the_rest() -> None:
    policy = with_drop_late(VllmPolicy)(VllmConfig())
    inst = Instance("lp0", policy, BlockManager(1000, 16), LinearPerfModel())
    inst.add_request(req("late", 100, arrival=0.0, ttft=0.5), 0.0)
    inst.add_request(req("on_time", 100, arrival=0.0, ttft=2.0), 0.0)
    inst.add_request(req("no_slo", 100, arrival=0.0, ttft=None), 0.0)
    plan, _, dropped = inst.schedule(1.0)
    assert [r.request_id for r in dropped] == ["late"]
    assert sorted(i.request_id for i in plan.items) == ["no_slo", "on_time"]
    assert with_drop_late(VllmPolicy) is type(policy)  # one class per base
