"""An executor that hangs (SIGSTOP) or dies (SIGKILL) under 50 streams, 2 instances:
its scheduler notices within the batch's hang deadline and turns NOT_SERVING, the
gateway routes nothing more to it and re-runs its requests on the other instance,
every stream completes with exactly the tokens an undisturbed run makes, and the
instance rejoins once its executor is back (docs/reliability.md)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from sloserve.client import Chunk, Client
from sloserve.services.drills.faults import (
    HEALTHY,
    LOST,
    FaultRun,
    run_fault,
    short_stream,
    wait_event,
)
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.stack import Stack


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
    # the restored copies of the re-run streams were offered to the gateway, which holds
    # them elsewhere: cancelled there, none left running on the restarted instance
    import grpc

    from sloserve.services.proto import scheduler_grpc, scheduler_pb2

    with grpc.insecure_channel(stack.services[f"scheduler-{LOST}"].address) as ch:
        st = scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(),
                                                     metadata=stack.internal_metadata)
    assert (st.num_waiting, st.num_running) == (0, 0)


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
        wait_event(stack.cfg.log_dir / "gateway.log", "instance_lost", 0, 30)
        t0 = time.monotonic()
        try:
            short_stream(client, "during", 3)
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
    assert [c.index for c in short_stream(client, "after", 3)] == [0, 1, 2]
