"""The simulator drives the real policies deterministically, token by token."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from sloserve.policies.slack import SlackConfig
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import GC_YOUNG, Simulation, quiet_gc, simulate

SMALL = SimConfig(policy="sarathi", trace="sharegpt", qps=2.0, num_requests=60,
                  ttft_slo=1.0, tbt_slo=0.15, seed=3)


def test_same_seed_gives_identical_results_and_another_seed_does_not() -> None:
    a, b = simulate(SMALL), simulate(dataclasses.replace(SMALL))
    c = simulate(dataclasses.replace(SMALL, seed=4))
    drop = ("sim_wall_s",)
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items()
                                                            if k not in drop}
    assert a["ttft_p50"] != c["ttft_p50"]


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "accelgen"])
def test_every_request_completes_with_every_token_timed(policy: str) -> None:
    sim = Simulation(dataclasses.replace(SMALL, policy=policy))
    out = sim.run()
    assert out["completed"] == out["requests"] == 60
    for r in sim.workload.requests:
        assert len(r.token_times) == r.output_len
        assert all(b >= a for a, b in zip(r.token_times, r.token_times[1:], strict=False))
        assert r.first_scheduled_time is not None and r.first_scheduled_time >= r.arrival_time
    assert all(i.kv.num_used_blocks == 0 for i in sim.instances)


def test_ascendra_2l1h_offloads_under_load_and_completes_everything() -> None:
    cfg = dataclasses.replace(SMALL, policy="ascendra", instances=3, hp_instances=1,
                              qps=12.0, num_requests=300, ttft_slo=0.5)
    sim = Simulation(cfg)
    out = sim.run()
    assert out["offloads"] > 0
    assert out["completed"] + out["dropped"] == 300
    hp = [i for i in sim.instances if i.role == "hp"]
    assert len(hp) == 1


def test_iteration_times_come_from_the_ground_truth_not_the_policy_model() -> None:
    sim = Simulation(dataclasses.replace(SMALL, record_samples=True, noise_cv=0.0))
    sim.run()
    for s in sim.samples[:200]:
        assert s.duration == pytest.approx(sim.timing.batch_time(s.shape))


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="hp_instances"):
        simulate(dataclasses.replace(SMALL, hp_instances=1))
    with pytest.raises(ValueError, match="qps"):
        simulate(dataclasses.replace(SMALL, qps=0))
    with pytest.raises(ValueError, match="model"):
        simulate(dataclasses.replace(SMALL, model="gpt-5"))
    with pytest.raises(ValueError, match=r"noise_seed \(--noise-seed\): must be an integer"):
        simulate(dataclasses.replace(SMALL, noise_seed="0"))  # type: ignore[arg-type]


def test_noise_seed_moves_the_ground_truth_and_leaves_the_workload() -> None:
    """``noise_seed`` (a live stack's ``up --seed``) seeds the noise only: the same
    requests arrive; given as the run's own seed it changes nothing."""
    same = simulate(dataclasses.replace(SMALL, noise_seed=SMALL.seed))
    other = Simulation(dataclasses.replace(SMALL, noise_seed=11))
    base = Simulation(SMALL)
    out, ref = other.run(), base.run()
    assert same["ttft_p50"] == ref["ttft_p50"] and same["tbt_p99"] == ref["tbt_p99"]
    assert ([(r.arrival_time, r.prompt_len, r.output_len) for r in other.workload.requests]
            == [(r.arrival_time, r.prompt_len, r.output_len) for r in base.workload.requests])
    assert out["ttft_p50"] != ref["ttft_p50"]


def test_replayed_arrivals_replace_the_arrival_process() -> None:
    """``arrival_times`` (a live run's gateway stamps, ``bench --compare-sim``): replaying
    the generated offsets changes nothing; other offsets are where the requests arrive."""
    base = Simulation(SMALL)
    ref = base.run()
    offsets = tuple(r.arrival_time for r in base.workload.requests)
    same = simulate(dataclasses.replace(SMALL, arrival_times=offsets))
    assert {k: v for k, v in same.items() if k != "sim_wall_s"} == \
        {k: v for k, v in ref.items() if k != "sim_wall_s"}
    burst = Simulation(dataclasses.replace(SMALL, arrival_times=(0.0,) * len(offsets)))
    out = burst.run()
    assert [r.arrival_time for r in burst.workload.requests] == [0.0] * len(offsets)
    assert out["ttft_p99"] > ref["ttft_p99"]  # all at once queue behind each other


def test_replayed_arrivals_are_checked() -> None:
    n = len(Simulation(SMALL).workload.requests)
    with pytest.raises(ValueError, match=rf"arrival_times: {n - 1} offsets for {n} requests"):
        simulate(dataclasses.replace(SMALL, arrival_times=(0.0,) * (n - 1)))
    with pytest.raises(ValueError, match="arrival_times: every offset must be a finite"):
        simulate(dataclasses.replace(SMALL, arrival_times=(-1.0,) * n))


def test_a_run_tunes_the_cyclic_gc_only_while_it_runs() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with quiet_gc():
        assert gc.get_threshold()[0] == max(before[0], GC_YOUNG)
        assert gc.get_freeze_count() > frozen  # the set-up objects are out of full collections
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_a_policys_timer_wakes_its_idle_instance(overlap: bool) -> None:
    """``slack`` holds decode-only iterations on AccelGen's mix (decode pacing): an empty plan with
    a timer (``sim.events.WAKE``). Every held decode still runs, every request ends with
    every token, and far more prompts start the moment they arrive than without holds."""
    cfg = SimConfig(policy="slack", trace="azure-conv", qps=0.5, num_requests=120, seed=1,
                    ttft_slo=None, tbt_slo=0.1875, slo_mix="hetero", overlap=overlap)
    at_once = []
    for pace in (0.5, 0.0):
        c = dataclasses.replace(cfg, policy_config=SlackConfig(pace=pace))
        sim = Simulation(c)
        out = sim.run()
        assert out["completed"] == 120
        assert all(len(r.token_times) == r.output_len for r in sim.workload.requests)
        at_once.append(sum(r.first_scheduled_time == r.arrival_time
                           for r in sim.workload.requests))
    assert at_once[0] > 2 * at_once[1]
