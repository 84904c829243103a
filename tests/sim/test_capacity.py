"""Capacity bisection brackets the largest rate meeting the criterion."""

from __future__ import annotations

from typing import Any

import pytest

from sloserve.sim.capacity import find_capacity
from sloserve.sim.config import SimConfig

CFG = SimConfig(policy="sarathi", trace="sharegpt", num_requests=200, ttft_slo=1.0, tbt_slo=0.15)


def threshold_run(limit: float) -> Any:
    """A deterministic stand-in system whose goodput falls off exactly at ``limit`` req/s."""

    def run(cfg: SimConfig) -> dict[str, Any]:
        good = 1.0 if cfg.qps <= limit else 0.5
        return {"goodput_share": good, "tbt_token_p99": 0.01, "sched_delay_p50": 0.0,
                "token_criterion_share": good}

    return run


@pytest.mark.parametrize("limit", [0.3, 1.0, 2.7, 11.0])
def test_bisection_converges_within_tolerance_below_the_true_limit(limit: float) -> None:
    out = find_capacity(CFG, "goodput", 0.9, run=threshold_run(limit), rel_tol=0.02,
                        max_probes=30)
    assert limit * 0.97 <= out["capacity_qps"] <= limit
    assert not out["at_search_limit"]


def test_a_criterion_never_missed_is_reported_at_the_search_limit() -> None:
    out = find_capacity(CFG, "token", 0.9, run=threshold_run(1e9), qps_max=16)
    assert out["at_search_limit"] and out["capacity_qps"] == 16


def test_real_simulation_capacity_lies_between_a_met_and_a_missed_probe() -> None:
    out = find_capacity(CFG, "goodput", 0.9, qps_start=2.0, max_probes=6)
    met = [p["qps"] for p in out["probes"] if p["meets"]]
    missed = [p["qps"] for p in out["probes"] if not p["meets"]]
    assert met and missed and out["capacity_qps"] == max(met) < min(missed)


def test_unknown_criterion_and_bad_target_are_rejected() -> None:
    with pytest.raises(ValueError, match="criterion"):
        find_capacity(CFG, "p99", 0.9)
    with pytest.raises(ValueError, match="target"):
        find_capacity(CFG, "goodput", 1.5)
