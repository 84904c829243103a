"""The resume protocol at the scheduler's seam, with no timing left to chance: a
gateway that reconnects gets each token it lacks once, in order, even when some of
them were still held (a plan was hopping) or not yet flushed (a batch's report)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from helpers import make_instance
from redis_source import redis_url

from sloserve.instance import TokenEvent
from sloserve.services.convert import tokens_to_proto
from sloserve.services.proto import common_pb2, executor_pb2, scheduler_pb2
from sloserve.services.redisconn import connect
from sloserve.services.scheduler.clock import WallClock
from sloserve.services.scheduler.server import SchedulerService
from sloserve.services.scheduler.state import RequestStore
from sloserve.services.store import Keys

RID = "resume-me"


def _service() -> SchedulerService:
    store = RequestStore(connect(redis_url()), Keys("test-resume"), "lp0")
    return SchedulerService(make_instance("sarathi"), store, "sarathi",
                            executor_pb2.ExecutorDescription(), WallClock())


def _batch(svc: SchedulerService, token_id: int) -> list[TokenEvent]:
    """One real iteration of the core instance: ``RID`` gets its next token."""
    plan, _, _ = svc.instance.schedule(0.0)
    return svc.instance.complete(plan, 0.01, (), {RID: token_id})


def _tokens_msg(events: list[TokenEvent]) -> scheduler_pb2.SchedulerOutput:
    out = scheduler_pb2.SchedulerOutput()
    tokens_to_proto(events, (), out)
    return out


async def _connect(svc: SchedulerService, hello: scheduler_pb2.Hello
                   ) -> tuple[AsyncIterator[scheduler_pb2.SchedulerOutput], list[int]]:
    """A gateway's stream, opened (the Hello is taken), and the tokens of its first message."""
    async def inputs() -> AsyncIterator[scheduler_pb2.SchedulerInput]:
        yield scheduler_pb2.SchedulerInput(hello=hello)
        await asyncio.Event().wait()  # the gateway keeps its stream open

    stream = svc.Connect(inputs(), None)  # type: ignore[arg-type]
    first = await anext(stream)
    return stream, [t.index for t in first.tokens if t.request_id == RID]


async def _drain(stream: AsyncIterator[scheduler_pb2.SchedulerOutput],
                 got: list[int]) -> list[int]:
    """``got`` and the token indices of ``RID`` that reach the gateway until it is idle."""
    while True:
        try:
            out = await asyncio.wait_for(anext(stream), 0.2)
        except TimeoutError:
            return got
        got += [t.index for t in out.tokens if t.request_id == RID]


def _reconnect_after(held: bool) -> tuple[list[int], list[int]]:
    async def scenario() -> tuple[list[int], list[int]]:
        svc = _service()
        spec = common_pb2.RequestSpec(request_id=RID, prompt_token_ids=[66] * 40,
                                      max_tokens=40, arrival_time=0.0)
        first, got = await _connect(svc, scheduler_pb2.Hello(gateway_id="g1", inflight=[spec]))
        made = [100 + k for k in range(11)]
        for tok in made[:10]:  # tokens 0..9 reach the first gateway
            svc.send(_tokens_msg(_batch(svc, tok)))
        before = await _drain(first, got)
        last = _batch(svc, made[10])  # token 10 exists in the core ...
        if held:  # ... and waits in the hold (a plan just left) ...
            svc.hold()
            svc.send(_tokens_msg(last))
        resumed = common_pb2.RequestSpec()
        resumed.CopyFrom(spec)
        resumed.generated_token_ids.extend(made[:4])
        second, got = await _connect(svc, scheduler_pb2.Hello(gateway_id="g2",
                                                              inflight=[resumed]))
        if held:
            svc.unhold()
        else:  # ... or in the batch's report, flushed after the reconnect
            svc.send(_tokens_msg(last))
        svc.send(_tokens_msg(_batch(svc, 111)))  # then the run goes on
        after = await _drain(second, got)
        await second.aclose()  # type: ignore[attr-defined]
        return before, after

    return asyncio.run(scenario())


def test_a_reconnect_while_a_token_is_held_replays_it_once_in_order() -> None:
    before, after = _reconnect_after(held=True)
    assert before == list(range(10))
    assert after == list(range(4, 12))


def test_a_reconnect_before_a_batch_report_is_flushed_replays_it_once_in_order() -> None:
    before, after = _reconnect_after(held=False)
    assert before == list(range(10))
    assert after == list(range(4, 12))
