"""``sloserve bench --compare-sim`` and ``--overhead-out`` against a real sim stack (issue 14).

After the run, bench simulates the same workload on the deployment the stack reports
(Info + each scheduler's Status) and reports live vs sim per metric; ``--overhead-out``
saves the schedulers' measured gaps between batches as a profile ``simulate`` loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sloserve.services import cli
from sloserve.services.auth import INTERNAL_TOKEN_ENV, new_token
from sloserve.services.compare_sim import COMPARED
from sloserve.services.stack import Stack
from sloserve.sim.overhead import DELIVERY_SAMPLES, OverheadProfile


def test_compare_sim_reports_live_and_sim_per_metric_and_saves_a_loadable_profile(
        start_stack: Callable[..., Stack], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    token = new_token()
    monkeypatch.setenv(INTERNAL_TOKEN_ENV, token)  # the stack's internal plane and bench's
    stack = start_stack(policy="sarathi", internal_token=token)
    trace = tmp_path / "tiny.csv"
    trace.write_text("prompt_len,output_len\n" + "".join(f"{60 + 40 * k},{12 + 3 * k}\n"
                                                         for k in range(6)))
    profile = tmp_path / "overhead.json"
    code = cli.main(["bench", "--target", stack.gateway, "--trace-file", str(trace),
                     "--qps", "8", "--num-requests", "10", "--seed", "3", "--json",
                     "--compare-sim", "--overhead-out", str(profile)])
    assert code == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    cmp = out["compare_sim"]
    assert set(cmp["metrics"]) == {key for key, _ in COMPARED}
    for key in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "throughput_tok_s"):
        m = cmp["metrics"][key]
        assert m["live"] == out.get(key, m["live"]) and m["live"] > 0 and m["sim"] > 0
        assert m["diff"] == pytest.approx((m["live"] - m["sim"]) / m["sim"])
    # the simulated deployment is the one the stack reported about itself
    cfg = cmp["sim_config"]
    assert (cfg["policy"], cfg["instances"], cfg["hp_instances"], cfg["seed"], cfg["qps"]) == (
        "sarathi", 1, 0, 3, 8.0)
    assert cfg["overlap"] is True and cfg["policy_config"]["token_budget"] == 512
    # its ground truth draws the executor's own noise (the stack's seed 0, instance 0's
    # stream), not a stream seeded by the workload's seed 3
    assert (cfg["noise_replayed"], cfg["noise_seed"], cfg["noise_streams"],
            cfg["noise_cv"]) == (True, 0, "instance", 0.03)
    # its online perf model refits on the live perf-model service's clock (this stack's
    # --refit-interval 0.5, conftest), as the published fit says it to every scheduler
    assert cfg["refit_interval"] == 0.5
    # and its prefix caching is the Deployment's the schedulers report (on by default)
    assert cfg["prefix_caching"] is True
    assert cmp["sim_iterations"] > 0 and cmp["live_iterations"] > 0
    assert cmp["live_offloads"] == out["offloads"] == 0 and cmp["sim_offloads"] == 0
    assert cmp["arrival_lag_p50_ms"] is not None and cmp["delivery_lag_p50_ms"] >= 0
    # the same run on the instances' clock (iteration ends): tokens leave before the gateway
    side = cmp["instance_side_metrics"]
    assert set(side) == set(cmp["metrics"])
    assert 0 < side["ttft_p50"]["live"] <= cmp["metrics"]["ttft_p50"]["live"]
    # and once more with every request arriving when the gateway stamped it
    replay = cmp["replayed_arrivals"]
    assert replay["stamped"] == 10 and set(replay["metrics"]) == set(cmp["metrics"])
    assert replay["metrics"]["ttft_p50"]["live"] == cmp["metrics"]["ttft_p50"]["live"]
    assert replay["metrics"]["ttft_p50"]["sim"] > 0
    assert set(replay["instance_side_metrics"]) == set(cmp["metrics"])

    saved = OverheadProfile.load(profile)
    assert saved.backend == "sim" and saved.policy == "sarathi" and saved.overlap
    assert len(saved.samples_s) > 0 and all(x >= 0 for x in saved.samples_s)
    # and every token's delivery lag as the client saw it (the gateway's emit - the
    # iteration's end), which simulate adds to what it reports
    assert len(saved.delivery_s) == min(out["output_tokens"], DELIVERY_SAMPLES) > 0
    assert all(0 <= x < 5 for x in saved.delivery_s)
    # ... which simulate (and compare-sim) take as part of the ground truth
    code = cli.main(["simulate", "--policy", "sarathi", "--trace-file", str(trace),
                     "--qps", "8", "--num-requests", "10", "--seed", "3", "--json",
                     "--overhead-profile", str(profile)])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["overhead_profile"] == str(profile)


def test_compare_sim_flags_are_checked_before_anything_is_sent(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "sloserve-overhead-profile", "version": 1, "samples_s": [-1]}')
    code = cli.main(["bench", "--target", "127.0.0.1:1", "--trace", "sharegpt", "--qps", "1",
                     "--num-requests", "1", "--compare-sim", "--overhead-profile", str(bad)])
    assert code == 2
    assert "samples_s[0]" in capsys.readouterr().err
    code = cli.main(["bench", "--endpoint", "openai", "--target", "http://127.0.0.1:1",
                     "--trace", "sharegpt", "--qps", "1", "--num-requests", "1",
                     "--compare-sim"])
    assert code == 2
    assert "--endpoint grpc only" in capsys.readouterr().err


def test_replayed_arrivals_are_the_ones_the_simulation_runs() -> None:
    """``replay_arrivals`` simulates the compared config with the probe's stamped offsets,
    not the workload's: all at once here, so the queue (and TTFT P99) grows."""
    import dataclasses

    from sloserve.services.compare_sim import LiveTimings, replay_arrivals
    from sloserve.sim.config import SimConfig
    from sloserve.sim.simulator import simulate

    cfg = SimConfig(policy="sarathi", trace="sharegpt", qps=2.0, num_requests=40, seed=3)
    burst = (0.0,) * 40
    probe = LiveTimings(arrival_offsets=burst)
    live = simulate(cfg)  # stands in for a live summary: only its keys are read
    got = replay_arrivals(cfg, live, probe)["metrics"]["ttft_p99"]["sim"]
    assert got == simulate(dataclasses.replace(cfg, arrival_times=burst))["ttft_p99"]
    assert got > live["ttft_p99"]


def test_the_refit_clock_is_the_one_every_scheduler_reports_or_none() -> None:
    from sloserve.services.compare_sim import live_refit_interval
    from sloserve.services.proto import scheduler_pb2

    def st(interval: float) -> scheduler_pb2.SchedulerStatus:
        return scheduler_pb2.SchedulerStatus(coefficients_refit_interval_s=interval)

    assert live_refit_interval([st(1.0), st(1.0), st(1.0)]) == 1.0
    assert live_refit_interval([st(1.0), st(0.5)]) is None  # they disagree: the default
    assert live_refit_interval([st(0.0)]) is None  # no fit said its period


def test_compare_sim_simulates_the_stacks_prefix_routing_and_its_prompt_only_identity(
        start_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``up --prefix-routing``: the simulation routes with the same ``PrefixRouter`` (it
    simulated round-robin before, 53 -> 83 ms TTFT P50 on the multi-turn bench), and names
    only the prompt's blocks, as the live scheduler does (docs/serve.md)."""
    token = new_token()
    monkeypatch.setenv(INTERNAL_TOKEN_ENV, token)
    stack = start_stack(policy="sarathi", instances=2, prefix_routing=True,
                        internal_token=token)
    code = cli.main(["bench", "--target", stack.gateway, "--trace", "multiturn",
                     "--qps", "8", "--num-requests", "8", "--seed", "3", "--json",
                     "--compare-sim"])
    assert code == 0
    cmp = json.loads(capsys.readouterr().out.splitlines()[-1])["compare_sim"]
    cfg = cmp["sim_config"]
    assert (cfg["prefix_caching"], cfg["prefix_routing"], cfg["prefix_cache_outputs"]) == (
        True, True, False)
    assert 0 < cmp["sim_prefix_hit_rate"] < 1
