"""The poison-input drill (docs/reliability.md): every poison input through a gRPC client
and the oversized ones at the frame level (``h2``), while a normal stream flows; the
refusals' latencies, the stream's gaps and the gateway's memory."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import grpc

from sloserve.client import Chunk, Client
from sloserve.services.drills.h2 import Refusal, send_oversized
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.proto import gateway_pb2
from sloserve.services.rpc import client_options
from sloserve.services.soak_cmd import rss_bytes
from sloserve.services.stack import Stack

MiB = 1 << 20


def _req(**kw: object) -> gateway_pb2.GenerateRequest:
    base: dict[str, object] = {"prompt": "hi", "max_tokens": 4}
    return gateway_pb2.GenerateRequest(**{**base, **kw})  # type: ignore[arg-type]


BIG = ("17 MB request_id", "32 MB prompt")  # over the gateway's 4 MiB gRPC limit
GENERATE = "/sloserve.v1.Gateway/Generate"


def _poison() -> list[tuple[str, bytes, grpc.StatusCode, str]]:
    """(name, serialized request, expected code, part of the details), built when needed."""
    return [
        ("17 MB request_id", _req(request_id="r" * (17 * MiB)).SerializeToString(),
         grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max (17825"),
        ("32 MB prompt", _req(prompt="p" * (32 * MiB)).SerializeToString(),
         grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max (33554"),
        ("2 MB prompt", _req(prompt="p" * (2 * MiB)).SerializeToString(),
         grpc.StatusCode.INVALID_ARGUMENT, "prompt: over"),
        ("600 KB prompt", _req(prompt="p" * (600 << 10)).SerializeToString(),
         grpc.StatusCode.INVALID_ARGUMENT, "prompt: at least"),
        ("129-char request_id", _req(request_id="r" * 129).SerializeToString(),
         grpc.StatusCode.INVALID_ARGUMENT, "request_id:"),
        ("ttft_slo 1e308", _req(ttft_slo=1e308).SerializeToString(),
         grpc.StatusCode.INVALID_ARGUMENT, "ttft_slo:"),
        ("tbt_slo 5e-324", _req(tbt_slo=5e-324).SerializeToString(),
         grpc.StatusCode.INVALID_ARGUMENT, "tbt_slo:"),
        ("malformed protobuf", b"\xff\xff\xff\xff",
         grpc.StatusCode.INVALID_ARGUMENT, "request: not a valid sloserve.v1.GenerateRequest"),
        ("truncated protobuf", _req(request_id="abc").SerializeToString()[:-2],
         grpc.StatusCode.INVALID_ARGUMENT, "request: not a valid sloserve.v1.GenerateRequest"),
    ]


def _poison_latencies(target: str, rounds: int) -> dict[str, list[float]]:
    """Each poison ``rounds`` times through a gRPC client: seconds to its status."""
    out: dict[str, list[float]] = {}
    cases = _poison()
    with grpc.insecure_channel(target, options=client_options()) as ch:
        generate = ch.unary_stream(GENERATE, request_serializer=lambda b: b,
                                   response_deserializer=gateway_pb2.GenerateChunk.FromString)
        list(generate(_req(prompt="warm").SerializeToString(), timeout=10))
        for _ in range(rounds):
            for name, raw, code, details in cases:
                t0 = time.perf_counter()
                try:
                    list(generate(raw, timeout=10))
                except grpc.RpcError as exc:
                    err = exc
                else:
                    raise AssertionError(f"{name}: not refused")
                out.setdefault(name, []).append(time.perf_counter() - t0)
                assert err.code() == code, (name, err.code(), err.details())
                assert details in (err.details() or ""), (name, err.details())
                assert "Unexpected" not in (err.details() or ""), name
    return out


@dataclass
class PoisonRun:
    latencies: dict[str, list[float]]  # s, per poison, through a gRPC client
    refusals: dict[str, list[Refusal]]  # the oversized ones at the frame level
    gaps: list[float] = field(default_factory=list)  # the normal stream, s
    during: list[float] = field(default_factory=list)  # its gaps while the poison ran
    after: list[float] = field(default_factory=list)
    rss_before: int = 0  # the gateway's, bytes
    rss_after: int = 0  # right after the poison
    rss_settled: int = 0  # 2 s later

    @property
    def median_gap(self) -> float:
        return statistics.median(self.gaps)


def run_poison(stack: Stack, rounds: int = 1, tokens: int = 300) -> PoisonRun:
    """A normal stream of ``tokens`` tokens, and while it runs every poison input ``rounds``
    times plus the oversized ones 5 times at the frame level (``h2``)."""
    client = Client(stack.gateway)
    normal: list[Chunk] = []
    started = threading.Event()
    gw = stack.services["gateway"].proc
    assert gw is not None
    list(client.generate(prompt_token_ids=[66] * 50, max_tokens=4))  # warm
    rss_before = rss_bytes(gw.pid)

    def stream() -> None:
        for c in client.generate(prompt_token_ids=[66] * 50, max_tokens=tokens,
                                 request_id="normal", ttft_slo=60.0, tbt_slo=60.0,
                                 timeout=120):
            normal.append(c)
            started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(30)
    p0 = time.perf_counter()
    latencies = _poison_latencies(stack.gateway, rounds)
    host, port = stack.gateway.rsplit(":", 1)
    sizes = {"17 MB request_id": 17 * MiB + 6, "32 MB prompt": 32 * MiB + 6}
    refusals = {name: [send_oversized(host, int(port), GENERATE, n) for _ in range(5)]
                for name, n in sizes.items()}
    p1 = time.perf_counter()
    run = PoisonRun(latencies, refusals, rss_before=rss_before, rss_after=rss_bytes(gw.pid))
    t.join(timeout=120)
    assert [c.token_id for c in normal] == [pseudo_token("normal", i) for i in range(tokens)]
    assert time.time() - (time.perf_counter() - p1) < normal[-1].time, \
        "the normal stream ended before the poison: it proves nothing"
    # the gateway's send times (``Chunk.time``): the stream as the gateway served it, apart
    # from this process, which is busy sending the poison
    w0, w1 = time.time() - (time.perf_counter() - p0), time.time() - (time.perf_counter() - p1)
    sent = [c.time for c in normal]
    run.gaps = [b - a for a, b in zip(sent, sent[1:])]
    run.during = [g for g, at in zip(run.gaps, sent[1:]) if w0 <= at <= w1 + 0.05]
    run.after = [g for g, at in zip(run.gaps, sent[1:]) if at > w1 + 0.05]
    time.sleep(2.0)
    run.rss_settled = rss_bytes(gw.pid)
    client.close()
    return run
