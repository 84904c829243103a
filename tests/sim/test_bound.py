"""The goodput bound (``sloserve.sim.bound``): what it counts, and that no run beats it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sloserve.perf.ground_truth import ProfileTiming
from sloserve.request import SLO, Request
from sloserve.sim.bound import goodput_bound, linear_floor, work_floor
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation, simulate

FLOOR = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0)


def reqs(n: int, prompt: int = 1000, output: int = 50, ttft: float = 1.0,
         tbt: float = 0.1, gap: float = 0.0) -> list[Request]:
    return [Request(f"r{i}", i * gap, prompt, output, SLO(ttft=ttft, tbt=tbt))
            for i in range(n)]


def test_a_long_run_bound_approaches_requests_over_the_cheapest_target_share_of_work() -> None:
    # evenly spaced arrivals: the longer the run, the less its edge (serving after the last
    # arrival) counts, and the bound tends to N / (the ceil(0.9 N) smallest work floors)
    w = work_floor(reqs(1)[0], FLOOR, linear_floor(FLOOR, 8192))[0]
    rates = []
    for n in (100, 1000, 5000):
        rs = reqs(n - 1, gap=1.0) + reqs(1, prompt=6000, gap=1.0)  # the long one left out
        b = goodput_bound(rs, FLOOR, qps=1.0)
        long_run = n / (math.ceil(0.9 * n) * w)
        assert b["capacity_long_run_qps"] == pytest.approx(long_run, rel=1e-9)
        rates.append(b["capacity_qps"] / long_run)
    assert rates[0] > rates[1] > rates[2] >= 1.0
    assert rates[2] < 1.02


def test_the_bound_rescales_arrivals_to_the_rate_they_were_drawn_at() -> None:
    a = goodput_bound(reqs(200, gap=1.0), FLOOR, qps=1.0)
    b = goodput_bound(reqs(200, gap=0.25), FLOOR, qps=4.0)
    assert a["capacity_qps"] == pytest.approx(b["capacity_qps"], rel=1e-5)


def test_requests_all_at_once_fit_in_their_ttft_or_not_at_any_rate() -> None:
    # 9 of 10 one-second-TTFT prompts of ~0.07 s each fit in the first second; 27 of 30 do not
    assert goodput_bound(reqs(10), FLOOR, qps=1.0)["capacity_qps"] == math.inf
    assert goodput_bound(reqs(30), FLOOR, qps=1.0)["capacity_qps"] == 0.0


def test_more_instances_bound_at_least_as_much_per_instance() -> None:
    one = goodput_bound(reqs(300, gap=1.0), FLOOR, qps=1.0)["capacity_qps"]
    three = goodput_bound(reqs(300, gap=1.0), FLOOR, qps=1.0, instances=3)["capacity_qps"]
    assert three >= 3 * one * (1 - 1e-5)


def test_too_many_infeasible_requests_bound_is_zero() -> None:
    rs = reqs(8, gap=1.0) + reqs(2, ttft=0.001)  # 2 of 10 cannot prefill in 1 ms: 8 < 0.9 x 10
    b = goodput_bound(rs, FLOOR, qps=1.0)
    assert b["feasible"] == 8 and b["capacity_qps"] == 0.0


def test_a_short_run_served_past_its_last_arrival_stays_under_the_bound() -> None:
    # 60 requests with long outputs: vLLM serves all of them well at 3x N / sum(work), the
    # first version's figure, because it keeps decoding after the last arrival; the bound
    # counts that time
    cfg = SimConfig(policy="vllm", trace=None, fixed_lengths=(500, 300), num_requests=60,
                    ttft_slo=1.0, tbt_slo=0.1, qps=1.0)
    rs = reqs(60, 500, 300)
    w = work_floor(rs[0], FLOOR, linear_floor(FLOOR, 8192))[0]
    span_only = 60 / (54 * w)
    s = simulate(dataclasses.replace(cfg, qps=3 * span_only))
    assert s["goodput_share"] >= 0.9
    sim = Simulation(cfg)
    assert goodput_bound(sim.workload.requests, FLOOR, qps=1.0)["capacity_qps"] >= 3 * span_only


def test_no_simulated_policy_meets_the_target_above_the_bound() -> None:
    cfg = SimConfig(policy="slack", trace=None, fixed_lengths=(1500, 40), num_requests=300,
                    ttft_slo=1.0, tbt_slo=0.1)
    sim = Simulation(dataclasses.replace(cfg, qps=1.0))
    bound = goodput_bound(sim.workload.requests, FLOOR, qps=1.0)["capacity_qps"]
    for policy in ("slack", "vllm"):
        s = simulate(dataclasses.replace(cfg, policy=policy, qps=1.15 * bound))
        assert s["goodput_share"] < 0.9, policy


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="target"):
        goodput_bound(reqs(2), FLOOR, qps=1.0, target=0.0)
    with pytest.raises(ValueError, match="instances"):
        goodput_bound(reqs(2), FLOOR, qps=1.0, instances=0)
    with pytest.raises(ValueError, match="requests"):
        goodput_bound([], FLOOR, qps=1.0)
    with pytest.raises(ValueError, match="qps"):
        goodput_bound(reqs(2), FLOOR, qps=0.0)
