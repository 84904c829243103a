"""One implementation, two drivers: the simulator and the live services decide alike.

The same seeded scenario (Ascendra 2 LP + 1 HP, ShareGPT lengths, tight TTFT
SLOs so that requests are ticketed, offloaded and queued) runs through the
simulator and through the live stack with the sim backend on a virtual clock
driven by a conductor (``conductor.py``). Both sides use the same ground
truth (the A100 profile without noise) and a frozen roofline perf model, so
every decision must match: the controller's routing decisions in order, and
each instance's sequence of batch plans. A rule changed on either side alone
makes this test fail.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from conductor import Conductor

from sloserve.decisions import action_record, plan_record
from sloserve.request import Request
from sloserve.services.proto import gateway_grpc, gateway_pb2, scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation
from sloserve.workload.traces import load_trace

SCENARIO = dict(policy="ascendra", model="llama-3-8b", gpu="a100", instances=3, hp_instances=1,
                qps=14.0, num_requests=40, ttft_slo=0.4, tbt_slo=0.15, seed=5, noise_cv=0.0)
MAX_OUTPUT = 24  # ShareGPT prompts, outputs capped: a few hundred iterations in all


def scenario_trace(path: Path) -> Path:
    """ShareGPT's prompt lengths with outputs capped at ``MAX_OUTPUT`` tokens."""
    rows = load_trace("sharegpt")[:200]
    path.write_text("prompt_len,output_len\n" + "".join(
        f"{r.prompt_len},{min(r.output_len, MAX_OUTPUT)}\n" for r in rows))
    return path


def simulated(trace: Path) -> Simulation:
    sim = Simulation(SimConfig(**SCENARIO, trace=None, trace_file=str(trace),  # type: ignore[arg-type]
                               record_decisions=True, perf_model="roofline"))
    sim.run()
    return sim


def _no_ties(sim: Simulation) -> None:
    """The scenario must be unambiguous: no two independent events (arrivals, batch
    ends) coincide (at equal times the simulator's order is arbitrary, the live
    stack's a race). Batch starts are caused by these events, so they may."""
    instants = [(r.arrival_time, "arrival") for r in sim.workload.requests]
    for inst, _, end, _ in sim.plans or ():
        instants.append((end, inst))
    instants.sort()
    for (a, who_a), (b, who_b) in zip(instants, instants[1:]):
        assert b - a > 1e-9 or who_a == who_b, f"tie at {a}: {who_a} / {who_b}"


def test_the_simulator_and_the_live_stack_make_the_same_decisions(
    start_stack: Callable[..., Stack], tmp_path: Path,
) -> None:
    sim = simulated(scenario_trace(tmp_path / "trace.csv"))
    _no_ties(sim)
    assert sim.num_offloads > 0 and sim.controller.decisions is not None
    causes = {a.cause for a in sim.controller.decisions if hasattr(a, "cause")}
    assert {"route", "ticket", "offload"} <= causes, causes

    stack = start_stack(
        policy="ascendra", instances=3, hp_instances=1, backend="sim", model="llama-3-8b",
        gpu="a100", noise_cv=0.0, tbt_slo=SCENARIO["tbt_slo"], clock="virtual",
        perf_model="roofline",
        coefficients_wait=0.0, decision_dir=tmp_path)
    requests = [Request(r.request_id, r.arrival_time, r.prompt_len, r.output_len, slo=r.slo,
                        priority=r.priority) for r in sim.workload.requests]
    conductor = Conductor(stack)
    asyncio.run(conductor.run(requests))
    assert not conductor.errors, conductor.errors

    live_actions = _lines(tmp_path / "gateway.jsonl")
    assert live_actions == [action_record(a) for a in sim.controller.decisions]
    for inst in sim.instances:
        iid = inst.instance_id
        want = [plan_record(i, p) for i, _, _, p in sim.plans or () if i == iid]
        got = _lines(tmp_path / f"scheduler-{iid}.jsonl")
        assert len(got) == len(want), iid
        assert got == want, iid
    for r in sim.workload.requests:  # and the tokens: exactly output_len each, at the same times
        chunks = conductor.streams[r.request_id]
        assert [c.index for c in chunks] == list(range(r.output_len))
        assert [c.produced_time for c in chunks] == r.token_times
    _gateway_read_every_stream_to_its_end(stack)


def _gateway_read_every_stream_to_its_end(stack: Stack) -> None:
    """The conductor's settle rule rests on InstanceInfo.output_seq: once the stack is
    idle it equals each scheduler's own count of messages sent, never more."""
    deadline = time.monotonic() + 10
    while True:
        with grpc.insecure_channel(stack.gateway) as ch:
            info = gateway_grpc.GatewayStub(ch).Info(gateway_pb2.InfoRequest(),
                                                     metadata=stack.internal_metadata)
        sent = {}
        for i in info.instances:
            with grpc.insecure_channel(stack.services[f"scheduler-{i.instance_id}"].address) as ch:
                sent[i.instance_id] = scheduler_grpc.SchedulerStub(ch).Status(
                    scheduler_pb2.StatusRequest(), metadata=stack.internal_metadata).output_seq
        read = {i.instance_id: i.output_seq for i in info.instances}
        assert all(read[i] <= sent[i] for i in read), (read, sent)
        if read == sent or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert read == sent and all(n > 0 for n in read.values()), (read, sent)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]
