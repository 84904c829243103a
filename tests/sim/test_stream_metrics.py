"""Streaming metrics: exact counts and shares, sketched percentiles, finished requests released."""

from __future__ import annotations

import dataclasses

import pytest

import sloserve.sim.simulator as simulator
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation, simulate
from sloserve.sketch import DEFAULT_REL_ERR

EXACT_KEYS = ("requests", "completed", "dropped", "unfinished", "good", "goodput_share",
              "goodput_rps", "duration", "token_slo_attainment", "token_criterion_share",
              "jct_slo_attainment", "output_tokens", "throughput_tok_s", "preemptions",
              "iterations", "offloads", "kv_utilization", "sim_time_s")
SKETCHED = ("ttft_p50", "ttft_p90", "ttft_p99", "tbt_p50", "tbt_p90", "tbt_p99",
            "tbt_token_p99", "mean_tbt_p50", "mean_tbt_p90", "mean_tbt_p99",
            "sched_delay_p50", "sched_delay_p99", "jct_p50", "jct_p99")
MEANS = ("ttft_mean", "tbt_mean")

CASES = {
    "sarathi_2x": SimConfig(policy="sarathi", trace="sharegpt", instances=2, qps=5.0,
                            num_requests=300, ttft_slo=1.0, tbt_slo=0.1, seed=2),
    # drops, offloads and unfinished-at-drop requests go through the same fold
    "ascendra_2l1h": SimConfig(policy="ascendra", trace="sharegpt", instances=3,
                               hp_instances=1, qps=14.0, num_requests=300, ttft_slo=0.5,
                               tbt_slo=0.1, seed=2),
    "accelgen_jct": SimConfig(policy="accelgen", trace="sharegpt", qps=4.0, num_requests=200,
                              slo_mix="hetero", jct_share=0.2, seed=2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stream_mode_keeps_counts_exact_and_percentiles_within_the_bound(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulator, "FOLD_EVERY", 7)  # many chunks, a partial last one
    cfg = CASES[name]
    exact = simulate(cfg)
    stream = simulate(dataclasses.replace(cfg, metrics="stream"))
    assert stream["metrics"] == "stream" and stream["percentile_rel_err"] == DEFAULT_REL_ERR
    for key in EXACT_KEYS:
        assert stream[key] == exact[key], key
    for key in SKETCHED:
        if exact[key] is None:
            assert stream[key] is None, key
        else:
            assert abs(stream[key] - exact[key]) <= DEFAULT_REL_ERR * exact[key] + 1e-12, key
    for key in MEANS:
        assert stream[key] == pytest.approx(exact[key], rel=1e-9), key


def test_stream_mode_releases_every_request_it_has_summarised() -> None:
    sim = Simulation(dataclasses.replace(CASES["sarathi_2x"], metrics="stream"))
    out = sim.run()
    assert out["completed"] == 300
    assert sim.requests == {} and sim.workload.requests == [] and sim._retired == []
    assert all(not i.requests for i in sim.instances)


def test_exact_mode_stays_the_default_and_keeps_every_request() -> None:
    sim = Simulation(CASES["sarathi_2x"])
    out = sim.run()
    assert "metrics" not in out and len(sim.workload.requests) == 300


def test_unknown_metrics_mode_names_the_field() -> None:
    with pytest.raises(ValueError, match="metrics"):
        simulate(dataclasses.replace(CASES["sarathi_2x"], metrics="approx"))
