"""The goodput bound (``sloserve.sim.bound``): what it counts, and that no run beats it."""

from __future__ import annotations

import dataclasses

import pytest

from sloserve.perf.ground_truth import ProfileTiming
from sloserve.request import SLO, Request
from sloserve.sim.bound import goodput_bound, linear_floor, work_floor
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

FLOOR = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0)


def reqs(n: int, prompt: int = 1000, output: int = 50, ttft: float = 1.0,
         tbt: float = 0.1) -> list[Request]:
    return [Request(f"r{i}", 0.0, prompt, output, SLO(ttft=ttft, tbt=tbt)) for i in range(n)]


def test_bound_is_requests_over_the_cheapest_target_share_of_work() -> None:
    rs = reqs(9) + reqs(1, prompt=6000)  # the one long prompt is left out at target 0.9
    b = goodput_bound(rs, FLOOR)
    per_token = linear_floor(FLOOR, 8192)
    w = work_floor(rs[0], FLOOR, per_token)[0]
    assert b["capacity_qps"] == pytest.approx(10 / (9 * w))


def test_bound_scales_with_instances() -> None:
    rs = reqs(10)
    assert goodput_bound(rs, FLOOR, instances=3)["capacity_qps"] == pytest.approx(
        3 * goodput_bound(rs, FLOOR)["capacity_qps"])


def test_too_many_infeasible_requests_bound_is_zero() -> None:
    rs = reqs(8) + reqs(2, ttft=0.001)  # 2 of 10 cannot prefill in 1 ms: 8 < 0.9 x 10
    b = goodput_bound(rs, FLOOR)
    assert b["feasible"] == 8 and b["capacity_qps"] == 0.0


def test_no_simulated_policy_meets_the_target_above_the_bound() -> None:
    cfg = SimConfig(policy="slack", trace=None, fixed_lengths=(1500, 40), num_requests=300,
                    ttft_slo=1.0, tbt_slo=0.1)
    bound = goodput_bound(reqs(300, 1500, 40), FLOOR)["capacity_qps"]
    for policy in ("slack", "vllm"):
        s = simulate(dataclasses.replace(cfg, policy=policy, qps=1.15 * bound))
        assert s["goodput_share"] < 0.9, policy


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="target"):
        goodput_bound(reqs(2), FLOOR, target=0.0)
    with pytest.raises(ValueError, match="instances"):
        goodput_bound(reqs(2), FLOOR, instances=0)
    with pytest.raises(ValueError, match="requests"):
        goodput_bound([], FLOOR)
