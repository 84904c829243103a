"""Simulated prefix caching: hits lower TTFT; without identity nothing changes."""

from __future__ import annotations

import dataclasses

import pytest

from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

DROP = ("sim_wall_s",)


def test_caching_on_a_multiturn_workload_hits_and_cuts_ttft() -> None:
    cfg = SimConfig(policy="sarathi", trace="multiturn", num_requests=300, qps=3.0)
    on, off = simulate(cfg), simulate(dataclasses.replace(cfg, prefix_caching=False))
    assert on["prefix_hit_rate"] > 0.5
    assert "prefix_hit_rate" not in off
    assert on["ttft_p50"] < 0.5 * off["ttft_p50"]
    assert on["completed"] == off["completed"] == 300


def test_without_prefix_identity_caching_on_or_off_gives_the_same_run() -> None:
    cfg = SimConfig(policy="vllm", trace="sharegpt", num_requests=150, qps=4.0)
    on, off = simulate(cfg), simulate(dataclasses.replace(cfg, prefix_caching=False))
    for k in DROP:
        on.pop(k), off.pop(k)
    assert on == off


@pytest.mark.parametrize("routing", [False, True])
def test_prefix_routing_raises_hits_across_instances(routing: bool) -> None:
    cfg = SimConfig(policy="sarathi", trace="multiturn", instances=4, num_requests=400,
                    qps=8.0, prefix_routing=routing)
    out = simulate(cfg)
    assert out["completed"] == 400
    if routing:
        rr = simulate(dataclasses.replace(cfg, prefix_routing=False))
        assert out["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.05
        assert out["prefix_routed_to_match"] > 0.9 * 400
