"""An executor that hangs (SIGSTOP) or dies (SIGKILL) under 50 streams, 2 instances:
its scheduler notices within the batch's hang deadline and turns NOT_SERVING, the
gateway routes nothing more to it and re-runs its requests on the other instance,
every stream completes with exactly the tokens an undisturbed run makes, and the
instance rejoins once its executor is back (docs/reliability.md)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sloserve.client import Chunk, Client
from sloserve.services.executor.backends import pseudo_token
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


def _wait_event(log: Path, event: str, after: int, timeout: float) -> dict[str, object]:
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


def _one(client: Client, rid: str, n: int) -> list[Chunk]:
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
    started = threading.Barrier(n + 1)

    def one(k: int) -> None:
        try:
            chunks: list[Chunk] = []
            for c in client.generate(prompt_token_ids=[65 + k % 50] * (30 + 5 * k),
                                     max_tokens=max_tokens, ttft_slo=60.0, tbt_slo=60.0,
                                     request_id=f"fault-{k}", timeout=300):
                if not chunks:
                    started.wait(timeout=60)
                chunks.append(c)
            run.results[k] = chunks
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            run.errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
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
        gw = _wait_event(logs / "gateway.log", "instance_lost", 0, 30)
        run.gateway_s = float(gw["at"]) - t_fault  # type: ignore[arg-type]
        if fault == "kill-scheduler":
            run.detect_s = run.gateway_s
        else:
            lost = _wait_event(logs / f"scheduler-{LOST}.log", "executor_lost", 0, 30)
            run.detect_s = float(lost["at"]) - t_fault  # type: ignore[arg-type]
            run.predicted_s = float(lost["predicted_s"])  # type: ignore[arg-type]
            run.deadline_s = float(lost["deadline_s"])  # type: ignore[arg-type]
        run.after_lost = [_one(client, f"new-{k}", 3)[-1].instance_id for k in range(6)]
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
    back = _wait_event(logs / "gateway.log", "instance_back", 0, 60)
    run.rejoin_s = float(back["at"]) - t_back  # type: ignore[arg-type]
    run.after_back = [_one(client, f"back-{k}", 3)[-1].instance_id for k in range(6)]
    run.health.append(_health(stack))
    for t in threads:
        t.join(timeout=300)
    return run


def _check(run: FaultRun, n: int = 50, max_tokens: int = 120) -> None:
    assert not run.errors, run.errors[:3]
    assert len(run.results) == n
    moved = 0
    for k, chunks in run.results.items():
        rid = chunks[0].request_id
        assert [c.index for c in chunks] == list(range(max_tokens)), k  # no gap, no duplicate
        assert [c.token_id for c in chunks] == [pseudo_token(rid, i) for i in range(max_tokens)]
        assert chunks[-1].finish_reason == "length"
        moved += chunks[0].instance_id == LOST and chunks[-1].instance_id == HEALTHY
    assert moved > 0  # the lost instance's streams finished on the healthy one
    assert run.after_lost == [HEALTHY] * 6  # nothing routed to the lost instance
    assert LOST in run.after_back  # it rejoined the round-robin
    assert run.health == ["NOT_SERVING", "SERVING"]


def test_sigstopped_executor_is_detected_its_streams_rerun_and_it_rejoins(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", instances=2)
    run = run_fault(stack, "stop", hold_s=5.0)
    _check(run)
    assert 0 < run.detect_s <= 3 * run.predicted_s + 1.0, (run.detect_s, run.predicted_s)
    assert run.gateway_s - run.detect_s < 0.5


def test_sigkilled_executor_is_detected_its_streams_rerun_and_it_rejoins(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", instances=2)
    run = run_fault(stack, "kill", hold_s=1.0)
    _check(run)
    assert run.detect_s < 1.0


def test_sigkilled_scheduler_of_one_of_two_instances_has_its_streams_rerun_and_rejoins(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", instances=2)
    run = run_fault(stack, "kill-scheduler", hold_s=1.0)
    _check(run)
    assert run.detect_s < 1.0


def test_a_lone_instance_keeps_its_streams_through_a_hang_and_refuses_new_ones_meanwhile(
    start_stack: Callable[..., Stack],
) -> None:
    """With nowhere to re-run them, a hung instance's requests wait and resume (recomputed)
    once its executor is back; new requests are refused at once instead of hanging."""
    from sloserve.client import RequestDropped

    stack = start_stack(policy="sarathi")
    assert stack.cfg.log_dir is not None
    client = Client(stack.gateway)
    n, max_tokens = 12, 80
    results: dict[int, list[Chunk]] = {}
    errors: list[BaseException] = []
    started = threading.Barrier(n + 1)

    def one(k: int) -> None:
        try:
            chunks: list[Chunk] = []
            for c in client.generate(prompt_token_ids=[66 + k] * (40 + 10 * k),
                                     max_tokens=max_tokens, ttft_slo=60.0, tbt_slo=60.0,
                                     timeout=120):
                if not chunks:
                    started.wait(timeout=60)
                chunks.append(c)
            results[k] = chunks
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    proc = stack.services["executor-lp0"].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        _wait_event(stack.cfg.log_dir / "gateway.log", "instance_lost", 0, 30)
        t0 = time.monotonic()
        try:
            _one(client, "during", 3)
            refused = ""
        except RequestDropped as exc:
            refused = exc.details
        refused_s = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGCONT)
    for t in threads:
        t.join(timeout=120)
    assert "no healthy instance" in refused and refused_s < 1.0, (refused, refused_s)
    assert not errors, errors[:3]
    assert len(results) == n
    for chunks in results.values():
        rid = chunks[0].request_id
        assert [c.token_id for c in chunks] == [pseudo_token(rid, i) for i in range(max_tokens)]
    assert [c.index for c in _one(client, "after", 3)] == [0, 1, 2]
