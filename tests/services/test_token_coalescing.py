"""The cheap token path on a live sim stack (issue 33, item 3): with ``--stream-interval``
the gateway sends several tokens per gRPC message to a ``multi_token`` caller (the SDK)
and per SSE event, and the token stream stays exact: the SDK still yields every token
once, in order, each with its own time, the same tokens a one-token-per-chunk caller and
the OpenAI API get."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

from sloserve.client import Chunk, Client
from sloserve.services.drills.openai_burst import expected_text
from sloserve.services.proto import gateway_grpc, gateway_pb2, scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack
from sloserve.services.store import free_port

N = 40  # output tokens per request


@pytest.fixture
def stack(start_stack: Callable[..., Stack]) -> Stack:
    return start_stack(http_port=free_port(), stream_interval=4, time_scale=0.05)


def _raw(stack: Stack, request_id: str, multi: bool) -> list[gateway_pb2.GenerateChunk]:
    with grpc.insecure_channel(stack.gateway) as ch:
        stub = gateway_grpc.GatewayStub(ch)
        req = gateway_pb2.GenerateRequest(prompt="hello", max_tokens=N, request_id=request_id,
                                          multi_token=multi)
        return list(stub.Generate(req, timeout=60))


def test_the_sdk_gets_every_token_once_in_fewer_messages_each_timed(stack: Stack) -> None:
    multi = _raw(stack, "coalesced", multi=True)
    assert len(multi) < N  # several tokens to a message (first alone, then every 4)
    assert len(multi[0].token_ids) == 1  # the first token never waits
    assert sum(len(c.token_ids) for c in multi) == N
    assert [c.index for c in multi] == [
        sum(len(c.token_ids) for c in multi[:k]) for k in range(len(multi))]
    assert all(len(c.texts) == len(c.times) == len(c.produced_times) == len(c.token_ids)
               for c in multi)
    assert multi[-1].finish_reason == "length" and not any(c.finish_reason for c in multi[:-1])
    with Client(stack.gateway) as client:
        chunks = list(client.generate("hello", max_tokens=N, request_id="coalesced"))
    assert [c.index for c in chunks] == list(range(N))
    assert [c.token_id for c in chunks] == [t for c in multi for t in c.token_ids]
    times = [c.time for c in chunks]
    assert times == sorted(times) and len(set(times)) > len(multi) // 2  # its own time each
    assert all(c.produced_time <= c.time for c in chunks)
    assert [c.finish_reason for c in chunks] == [None] * (N - 1) + ["length"]


def test_a_one_token_caller_and_the_openai_api_get_the_same_tokens(stack: Stack) -> None:
    with Client(stack.gateway) as client:
        sdk = list(client.generate("hello", max_tokens=N, request_id="same"))
    single = _raw(stack, "same", multi=False)
    assert len(single) == N and not any(c.token_ids for c in single)
    assert [(c.index, c.token_id, c.text) for c in single] == [
        (c.index, c.token_id, c.text) for c in sdk]
    raw = httpx.post(stack.http + "/v1/completions", timeout=60, headers={
        "x-request-id": "same"}, json={"prompt": "hello", "max_tokens": N, "stream": True,
                                       "return_token_ids": True}).text
    events = [json.loads(e[len("data: "):]) for e in raw.split("\n\n")
              if e.startswith("data: {")]
    assert len(events) < N  # several tokens to an SSE event
    ids = [t for e in events for t in e["choices"][0]["token_ids"]]
    assert ids == [c.token_id for c in sdk]
    assert "".join(e["choices"][0]["text"] for e in events) == "".join(c.text for c in sdk)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_a_scheduler_sends_a_frontend_one_message_per_interval_each_token_timed(
    start_stack: Callable[..., Stack],
) -> None:
    """``--stream-interval 8`` reaches the scheduler (``scheduler/coalesce.py``): it puts
    far fewer messages on the gateway's stream than it runs iterations, every stream stays
    exact, and each token is stamped when it was due, not when its message left (a held
    token's wait, ``held_s``, is taken off): its lag behind its making stays under one
    iteration, where the hold alone would add up to seven."""
    k, n = 8, 96
    stack = start_stack(stream_interval=k, instances=1, http_port=free_port())
    ids = [f"held-{i}" for i in range(4)]

    def one(rid: str) -> list[Chunk]:
        with Client(stack.gateway) as client:
            return list(client.generate(prompt_token_ids=[65] * 16, max_tokens=n,
                                        request_id=rid, ignore_eos=True))

    with ThreadPoolExecutor(len(ids)) as pool:
        streams = dict(zip(ids, pool.map(one, ids)))
    for rid, chunks in streams.items():
        assert [c.index for c in chunks] == list(range(n))
        assert "".join(c.text for c in chunks) == expected_text(rid, n)
        assert chunks[-1].finish_reason == "length"
    (sched,) = [s for name, s in stack.services.items() if name.startswith("scheduler-")]
    with grpc.insecure_channel(sched.address) as ch:
        st = scheduler_grpc.SchedulerStub(ch).Status(
            scheduler_pb2.StatusRequest(), metadata=stack.internal_metadata, timeout=10)
    assert st.iterations >= n and st.outputs_held == 0
    assert st.output_seq < st.iterations / 3  # ~1 message per 8 iterations, + firsts/lasts
    gaps = [b.produced_time - a.produced_time for c in streams.values()
            for a, b in zip(c, c[1:]) if b.produced_time > a.produced_time]
    iteration = statistics.median(gaps)
    lags = [c.time - c.produced_time for cs in streams.values() for c in cs[1:-1]]
    assert statistics.median(lags) < iteration, (statistics.median(lags), iteration)
