"""The executor-fault drill (docs/reliability.md): 50 streams on 2 instances, then
executor-lp1 hangs (SIGSTOP) or dies (SIGKILL), or its scheduler dies; what the
scheduler, the gateway and the streams saw, and when."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sloserve.client import Chunk, Client
from sloserve.services.drills.streams import start_streams
from sloserve.services.proto import SERVICE_NAMES
from sloserve.services.stack import Stack

LOST, HEALTHY = "lp1", "lp0"


def _events(log: Path, event: str) -> list[dict[str, object]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        if f'"{event}"' in line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def wait_event(log: Path, event: str, after: int, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = _events(log, event)
        if len(ev) > after:
            return ev[after]
        time.sleep(0.02)
    raise AssertionError(f"{event} not in {log.name} within {timeout}s")


@dataclass
class FaultRun:
    results: dict[int, list[Chunk]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    detect_s: float = -1.0  # fault -> the scheduler's executor_lost
    gateway_s: float = -1.0  # fault -> the gateway's instance_lost
    predicted_s: float = 0.0
    deadline_s: float = 0.0
    after_lost: list[str] = field(default_factory=list)  # instances serving new requests then
    after_back: list[str] = field(default_factory=list)
    rejoin_s: float = -1.0  # executor resumed/restarted -> the gateway's instance_back
    health: list[str] = field(default_factory=list)  # the lost scheduler's: while lost, back


def _health(stack: Stack) -> str:
    with grpc.insecure_channel(stack.services[f"scheduler-{LOST}"].address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAMES["scheduler"]), timeout=2)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def short_stream(client: Client, rid: str, n: int) -> list[Chunk]:
    return list(client.generate(prompt_token_ids=[71] * 24, max_tokens=n, request_id=rid,
                                ttft_slo=60.0, tbt_slo=60.0, timeout=120))


def run_fault(stack: Stack, fault: str, hold_s: float, n: int = 50,
              max_tokens: int = 120) -> FaultRun:
    """``n`` streams on 2 instances; once all have a first token, ``fault`` hits
    executor-lp1 (``stop``: SIGSTOP for ``hold_s``, then SIGCONT; ``kill``: SIGKILL,
    restarted after ``hold_s``) or its scheduler (``kill-scheduler``: SIGKILL, restarted
    after ``hold_s``; it restores its requests from Redis and the gateway's Hello
    cancels those already re-run on the other instance)."""
    assert stack.cfg.log_dir is not None
    logs = stack.cfg.log_dir
    client = Client(stack.gateway)
    run = FaultRun()
    streams = start_streams(client, n, max_tokens, "fault")
    run.results, run.errors = streams.results, streams.errors
    time.sleep(0.3)
    proc = stack.services[f"executor-{LOST}"].proc
    assert proc is not None
    t_fault = time.time()
    if fault == "stop":
        proc.send_signal(signal.SIGSTOP)
    elif fault == "kill":
        stack.kill(f"executor-{LOST}")
    else:  # "kill-scheduler": the whole instance is unreachable
        stack.kill(f"scheduler-{LOST}")
    try:
        gw = wait_event(logs / "gateway.log", "instance_lost", 0, 30)
        run.gateway_s = float(gw["at"]) - t_fault  # type: ignore[arg-type]
        if fault == "kill-scheduler":
            run.detect_s = run.gateway_s
        else:
            lost = wait_event(logs / f"scheduler-{LOST}.log", "executor_lost", 0, 30)
            run.detect_s = float(lost["at"]) - t_fault  # type: ignore[arg-type]
            run.predicted_s = float(lost["predicted_s"])  # type: ignore[arg-type]
            run.deadline_s = float(lost["deadline_s"])  # type: ignore[arg-type]
        run.after_lost = [short_stream(client, f"new-{k}", 3)[-1].instance_id for k in range(6)]
        run.health.append(_health(stack) if fault != "kill-scheduler" else "NOT_SERVING")
        time.sleep(max(0.0, hold_s - (time.time() - t_fault)))
    finally:
        if fault == "stop":
            proc.send_signal(signal.SIGCONT)
    t_back = time.time()
    if fault == "kill":
        stack.restart(f"executor-{LOST}")
    elif fault == "kill-scheduler":
        stack.restart(f"scheduler-{LOST}")
    back = wait_event(logs / "gateway.log", "instance_back", 0, 60)
    run.rejoin_s = float(back["at"]) - t_back  # type: ignore[arg-type]
    run.after_back = [short_stream(client, f"back-{k}", 3)[-1].instance_id for k in range(6)]
    run.health.append(_health(stack))
    streams.join()
    return run
