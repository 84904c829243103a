"""A scheduler killed mid-run (SIGKILL) and restarted loses no accepted request:
it reloads them from Redis, the gateway reconnects and every stream completes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sloserve.client import Chunk, Client
from sloserve.services.stack import Stack


def test_sigkilled_scheduler_resumes_every_stream_without_loss_or_duplicates(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi")
    client = Client(stack.gateway)
    n, max_tokens = 12, 60
    results: dict[int, list[Chunk]] = {}
    errors: list[BaseException] = []
    started = threading.Barrier(n + 1)

    def one(k: int) -> None:
        try:
            chunks: list[Chunk] = []
            for c in client.generate(prompt_token_ids=[65 + k] * (50 + 20 * k),
                                     max_tokens=max_tokens, ttft_slo=30.0, tbt_slo=30.0):
                if not chunks:
                    started.wait(timeout=30)
                chunks.append(c)
            results[k] = chunks
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    started.wait(timeout=30)  # every request has streamed its first token
    time.sleep(0.2)
    stack.kill("scheduler-lp0")  # SIGKILL: no chance to flush anything
    stack.restart("scheduler-lp0")
    for t in threads:
        t.join(timeout=90)
    assert not errors, errors
    assert len(results) == n
    for k, chunks in results.items():
        assert [c.index for c in chunks] == list(range(max_tokens)), k  # complete, no duplicate
        assert chunks[-1].finish_reason == "length"
        # the same deterministic pseudo-tokens as an uninterrupted run would produce
        from sloserve.services.executor.backends import pseudo_token

        rid = chunks[0].request_id
        assert [c.token_id for c in chunks] == [pseudo_token(rid, i) for i in range(max_tokens)]


def test_reconnecting_gateway_gets_the_tokens_it_lacks_replayed(
    start_stack: Callable[..., Stack],
) -> None:
    """The resume protocol itself: a new stream's Hello says 4 tokens arrived; the
    scheduler replays from index 4 and carries on to the end, once each."""
    import asyncio

    import grpc

    from sloserve.services.proto import common_pb2, scheduler_grpc, scheduler_pb2

    stack = start_stack(policy="sarathi")
    stack.kill("gateway")  # this test is the gateway
    target = stack.services["scheduler-lp0"].address
    spec = common_pb2.RequestSpec(request_id="resume-me", prompt_token_ids=[66] * 40,
                                  max_tokens=40, arrival_time=time.time())

    async def connect(hello: scheduler_pb2.Hello, until: int) -> list[scheduler_pb2.TokenEvent]:
        q: asyncio.Queue[scheduler_pb2.SchedulerInput] = asyncio.Queue()
        q.put_nowait(scheduler_pb2.SchedulerInput(hello=hello))

        async def inputs():  # type: ignore[no-untyped-def]
            while True:
                yield await q.get()

        got: list[scheduler_pb2.TokenEvent] = []
        async with grpc.aio.insecure_channel(target) as ch:
            call = scheduler_grpc.SchedulerStub(ch).Connect(inputs(),
                                                           metadata=stack.internal_metadata)
            async for out in call:
                got += [t for t in out.tokens if t.request_id == spec.request_id]
                if len(got) >= until or (got and got[-1].finished):
                    call.cancel()
                    break
        return got

    async def scenario() -> tuple[list[int], list[int]]:
        first = await connect(scheduler_pb2.Hello(gateway_id="t", inflight=[spec]), until=10)
        resumed = common_pb2.RequestSpec()
        resumed.CopyFrom(spec)
        resumed.generated_token_ids.extend(t.token_id for t in first[:4])
        second = await connect(scheduler_pb2.Hello(gateway_id="t", inflight=[resumed]), 10**6)
        return [t.index for t in first], [t.index for t in second]

    first, second = asyncio.run(scenario())
    assert first[:10] == list(range(10))
    assert second == list(range(4, 40))  # replayed 4..9 once, then the rest, then finished


def test_gateway_drops_token_events_it_already_has() -> None:
    import asyncio

    from sloserve.controller import Controller
    from sloserve.request import Request
    from sloserve.services.gateway.server import Flight, GatewayService
    from sloserve.services.gateway.stream import TokenStream
    from sloserve.services.proto import common_pb2, executor_pb2, scheduler_pb2

    async def scenario() -> list[int]:
        desc = executor_pb2.ExecutorDescription(max_context=4096, kv_capacity_blocks=64,
                                                block_size=16)
        gw = GatewayService(Controller([("lp0", "lp")]), {"lp0": scheduler_pb2.SchedulerStatus(
            role="lp", executor=desc)}, {"lp0": "127.0.0.1:9"}, {})
        spec = common_pb2.RequestSpec(request_id="r", prompt_token_ids=[1], max_tokens=5)
        f = Flight(spec, Request("r", 0.0, 1, 5), TokenStream())
        gw.flights["r"] = f
        assert gw.ctl.admit(f.req, 0.0).instance_id == "lp0"  # type: ignore[union-attr]
        for idx in (0, 1, 0, 1, 2, 2, 3):  # a restarted scheduler regenerates 0..2
            gw.on_output("lp0", scheduler_pb2.SchedulerOutput(tokens=[
                scheduler_pb2.TokenEvent(request_id="r", index=idx, token_id=100 + idx)]))
        assert list(spec.generated_token_ids) == [100, 101, 102, 103]
        return f.events.pending()

    assert asyncio.run(scenario()) == [0, 1, 2, 3]
