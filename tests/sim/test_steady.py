"""Steady runs (sim.steady) change nothing: the policies' promise, and whole runs with and
without them, compared request by request."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.batch import ScheduledItem
from sloserve.instance import Instance
from sloserve.kv import BlockManager
from sloserve.perf.linear import LinearPerfModel
from sloserve.policies import get_spec
from sloserve.policies.base import Policy
from sloserve.policies.drop_late import with_drop_late
from sloserve.request import SLO, Request, RequestStatus
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation

STEADY = ("sarathi", "vllm", "orca")


def _policy(name: str, drop_late: bool) -> Policy:
    cls = get_spec(name).roles["lp"]
    if drop_late:
        cls = with_drop_late(cls)
    return cls(cls.config_cls(max_num_seqs=12))


def _decoding(inst: Instance, k: int, prompt: int, generated: int, output: int) -> Request:
    """A running request that has produced ``generated`` tokens and decodes next."""
    r = Request(f"r{k}", 0.1 * k, prompt, output, SLO(ttft=1.0, tbt=0.1))
    r.num_generated, r.num_computed = generated, prompt + generated - 1
    r.token_times = [1.0 + 0.01 * i for i in range(generated)]
    r.status, r.first_scheduled_time = RequestStatus.RUNNING, 0.2
    inst.kv.allocate(r.request_id, r.num_computed)
    inst.requests[r.request_id] = r
    inst.running.append(r)
    return r


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(STEADY), st.booleans(),
       st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40), st.integers(1, 40)),
                min_size=1, max_size=14),
       st.integers(0, 40), st.floats(0.0, 1e4))
def test_a_steady_policy_plans_every_decode_when_it_promised_to(
    name: str, drop_late: bool, shapes: list[tuple[int, int, int]], spare: int, now: float,
) -> None:
    policy = _policy(name, drop_late)
    kv = BlockManager(4000, 16)
    inst = Instance("lp0", policy, kv, LinearPerfModel())
    reqs = [_decoding(inst, k, p, g, g + extra) for k, (p, g, extra) in enumerate(shapes)]
    need = sum(1 for r in reqs if r.num_computed % kv.block_size == 0)
    kv._free = kv._free[:need + spare]  # KV left: just enough, or more
    if len(reqs) > policy.steady_decodes():
        return  # outside the promise
    plan = policy.schedule(inst.view(now))
    assert plan.items == [ScheduledItem(r.request_id, 1, r.num_computed, False) for r in reqs]
    assert not plan.preempted and not plan.offloaded and not plan.dropped


def test_policies_that_promise_nothing_are_never_run_steady() -> None:
    sim = Simulation(SimConfig(policy="ascendra", instances=3, hp_instances=1,
                               num_requests=10))
    assert sim._steady_limit == [0, 0, 0]
    for off in ({"record_decisions": True}, {"record_samples": True}, {"steady": False},
                {"overlap": True}):
        assert Simulation(SimConfig(policy="sarathi", num_requests=10, **off))._steady_limit == [0]
    assert Simulation(SimConfig(policy="sarathi", num_requests=10))._steady_limit == [256]


CASES: dict[str, dict[str, Any]] = {
    "sarathi": dict(policy="sarathi", qps=1.5, num_requests=400, ttft_slo=1.0, tbt_slo=0.15),
    "sarathi_4x_stream": dict(policy="sarathi", instances=4, qps=8.0, num_requests=600,
                              metrics="stream", seed=3),
    # KV short: steady runs end early, preemptions follow
    "vllm_kv": dict(policy="vllm", instances=2, qps=3.0, num_requests=300, num_blocks=900,
                    seed=2),
    "sarathi_kv": dict(policy="sarathi", qps=3.0, num_requests=300, num_blocks=900, seed=3),
    "orca": dict(policy="orca", qps=2.0, num_requests=200, seed=1),
    # refits on simulated time: a steady run's iterations that end in one go advance the
    # clock at each end, as the event loop does
    "sarathi_refit_clock": dict(policy="sarathi", qps=2.0, num_requests=300, seed=5,
                                refit_interval=0.5),
    # a frozen model observes every batch as it comes (no deferral)
    "sarathi_roofline": dict(policy="sarathi", qps=2.0, num_requests=200, seed=4,
                             perf_model="roofline"),
}


def _run(cfg: SimConfig) -> tuple[Simulation, dict[str, Any], list[tuple[Any, ...]]]:
    sim = Simulation(cfg)
    reqs = list(sim.workload.requests)
    out = sim.run()
    out.pop("sim_wall_s")
    state = [(r.request_id, r.status, r.token_times, r.finish_time, r.num_preemptions,
              r.first_scheduled_time, r.num_computed, r.num_generated) for r in reqs]
    return sim, out, state


@pytest.mark.parametrize("name", sorted(CASES))
def test_steady_runs_give_the_same_run_request_by_request(name: str) -> None:
    cfg = SimConfig(trace="sharegpt", **CASES[name])
    sim, out, state = _run(cfg)
    ref, ref_out, ref_state = _run(dataclasses.replace(cfg, steady=False))
    assert sim.num_steady > 0 and ref.num_steady == 0
    if name == "sarathi":  # unloaded: most iterations are steady
        assert sim.num_steady > out["iterations"] // 2
    assert out == ref_out
    if cfg.metrics == "exact":
        assert state == ref_state
    assert sim.perf_model.coefficients == ref.perf_model.coefficients
    assert sim.perf_model.num_samples == ref.perf_model.num_samples
    assert sim.kv_util_sum == ref.kv_util_sum
    for a, b in zip(sim.instances, ref.instances):
        assert a.kv.holders() == b.kv.holders() and a.kv.num_free_blocks == b.kv.num_free_blocks
