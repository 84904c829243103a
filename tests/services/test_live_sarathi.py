"""End to end on one sarathi instance: SDK -> gateway -> scheduler -> sim executor."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from sloserve.client import AlreadyExists, Cancelled, Client, InvalidArgument
from sloserve.services.proto import scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack


@pytest.fixture
def stack(start_stack: Callable[..., Stack]) -> Stack:
    return start_stack(policy="sarathi")


def _status(stack: Stack) -> scheduler_pb2.SchedulerStatus:
    addr = stack.services["scheduler-lp0"].address
    with grpc.insecure_channel(addr) as ch:
        return scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(),
                                                       metadata=stack.internal_metadata)


def test_concurrent_streams_get_every_token_in_order_with_timing(stack: Stack) -> None:
    client = Client(stack.gateway)
    results: dict[int, list] = {}

    def one(k: int) -> None:
        results[k] = list(client.generate(f"prompt number {k} " * (k + 1), max_tokens=6 + k,
                                          ttft_slo=2.0, tbt_slo=0.5))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for k, chunks in results.items():
        assert [c.index for c in chunks] == list(range(6 + k))
        assert chunks[-1].finish_reason == "length"
        assert all(c.finish_reason is None for c in chunks[:-1])
        times = [c.time for c in chunks]
        assert times == sorted(times) and times[0] > chunks[0].arrival_time
        assert "".join(c.text for c in chunks) == bytes(c.token_id for c in chunks).decode()
    assert len(results) == 8
    st = _status(stack)
    assert (st.num_waiting, st.num_running) == (0, 0)
    assert st.kv_free_blocks == st.executor.kv_capacity_blocks
    assert st.coefficients_version >= 1  # the perf-model service fitted and published


def test_invalid_input_is_rejected_naming_the_field(stack: Stack) -> None:
    client = Client(stack.gateway)
    cases = {
        "prompt": dict(prompt=""),
        "max_tokens": dict(prompt="hi", max_tokens=0),
        "tbt_slo": dict(prompt="hi", tbt_slo=-1.0),
        "prompt_token_ids": dict(prompt_token_ids=[1, 300]),
    }
    for field, kw in cases.items():
        with pytest.raises(InvalidArgument) as err:
            list(client.generate(**kw))  # type: ignore[arg-type]
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details.startswith(field), err.value.details
    too_long = client.generate(prompt_token_ids=[65] * 8000, max_tokens=500)
    with pytest.raises(InvalidArgument, match="^max_tokens"):
        list(too_long)


def test_cancel_and_disconnect_free_the_request_everywhere(stack: Stack) -> None:
    client = Client(stack.gateway)
    stream = client.generate("cancel me", max_tokens=2000, request_id="to-cancel")
    assert next(stream).index == 0
    with pytest.raises(AlreadyExists):
        list(client.generate("dup", max_tokens=3, request_id="to-cancel"))
    assert client.cancel("to-cancel")
    with pytest.raises(Cancelled):
        list(stream)
    gone = client.generate("walk away", max_tokens=2000)
    next(gone)
    gone.close()  # the client disconnects mid-stream
    deadline = time.monotonic() + 10
    while (st := _status(stack)).num_running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (st.num_waiting, st.num_running) == (0, 0)
    assert st.kv_free_blocks == st.executor.kv_capacity_blocks
    assert not client.cancel("to-cancel")


def test_bench_replays_a_trace_file_and_reports_simulate_keys(stack: Stack, tmp_path: Path) -> None:
    trace = tmp_path / "tiny.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{40 + 30 * k},{4 + k}\n" for k in range(6)))
    cmd = [sys.executable, "-m", "sloserve.services.cli"]
    bench = subprocess.run(
        [*cmd, "bench", "--target", stack.gateway, "--trace-file", str(trace), "--qps", "8",
         "--num-requests", "10", "--json"], capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr
    measured = json.loads(bench.stdout)
    sim = subprocess.run(
        [*cmd, "simulate", "--policy", "sarathi", "--trace-file", str(trace), "--qps", "8",
         "--num-requests", "10", "--json"], capture_output=True, text=True, timeout=120)
    simulated = json.loads(sim.stdout)
    assert measured["completed"] == measured["requests"] == 10
    assert measured["output_tokens"] == simulated["output_tokens"]
    summary_keys = {k for k in simulated if k in measured}
    assert {"ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "goodput_share"} <= summary_keys


def test_every_service_has_health_reflection_and_the_perf_model_publishes(stack: Stack) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from sloserve.services.proto import common_pb2, perfmodel_grpc, perfmodel_pb2

    for svc in stack.services.values():
        with grpc.insecure_channel(svc.address) as ch:
            health = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=svc.health))
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            listed = next(iter(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
            assert svc.health in {s.name for s in listed.list_services_response.service}
    with grpc.insecure_channel(stack.services["perfmodel"].address) as ch:
        pm = perfmodel_grpc.PerfModelStub(ch)
        md = stack.internal_metadata
        watch = pm.WatchCoefficients(perfmodel_pb2.CoefficientsRequest(), metadata=md)
        first = next(watch)
        watch.cancel()
        coeffs = pm.GetCoefficients(perfmodel_pb2.CoefficientsRequest(), metadata=md)
        assert coeffs.version >= first.version >= 1 and len(coeffs.values) == 5
        shape = common_pb2.BatchShape(decodes=[512] * 8)
        small = pm.Predict(perfmodel_pb2.PredictRequest(shape=shape), metadata=md).duration_s
        shape.prefills.add(chunk_len=512, context_len=0)
        assert pm.Predict(perfmodel_pb2.PredictRequest(shape=shape),
                         metadata=md).duration_s > small > 0
