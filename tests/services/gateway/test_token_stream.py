"""A request's token stream at the gateway (issue 33, item 3): tokens ready at once leave
together, at most every ``stream_interval`` tokens after the first, the last at once; an
end (drop, cancel) comes after every token already in; each token keeps its own time."""

from __future__ import annotations

import asyncio

import pytest

from sloserve.controller import Drop
from sloserve.services.gateway.stream import Ended, TokenStream
from sloserve.services.proto import scheduler_pb2


def _ev(i: int, finished: bool = False) -> scheduler_pb2.TokenEvent:
    return scheduler_pb2.TokenEvent(request_id="r", index=i, token_id=100 + i,
                                    finished=finished)


async def _ready(s: TokenStream) -> list[int] | None:
    """The indices ``take`` returns now, or None when it would wait."""
    task = asyncio.ensure_future(s.take())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    if not task.done():
        task.cancel()
        return None
    events, _ = task.result()
    return [e.index for e in events]


def test_first_token_at_once_then_every_interval_and_the_last_at_once() -> None:
    async def scenario() -> list[list[int] | None]:
        s, seen = TokenStream(interval=3), []
        s.push(_ev(0), 1.0)
        seen.append(await _ready(s))  # the first token never waits for the interval
        for i in (1, 2):
            s.push(_ev(i), 1.0 + i)
        seen.append(await _ready(s))  # 2 of 3: held
        s.push(_ev(3), 4.0)
        seen.append(await _ready(s))  # 3: due, all three in one batch
        s.push(_ev(4, finished=True), 5.0)
        seen.append(await _ready(s))  # the last token leaves at once
        return seen

    assert asyncio.run(scenario()) == [[0], None, [1, 2, 3], [4]]


def test_a_waiting_taker_is_woken_with_every_token_ready_and_their_own_times() -> None:
    async def scenario() -> tuple[list[int], list[float]]:
        s = TokenStream(interval=1)
        s.push(_ev(0), 1.0)
        await s.take()
        task = asyncio.ensure_future(s.take())
        await asyncio.sleep(0)
        s.push(_ev(1), 2.0)  # both arrive before the taker runs: one batch
        s.push(_ev(2), 2.5)
        events, times = await task
        return [e.index for e in events], times

    assert asyncio.run(scenario()) == ([1, 2], [2.0, 2.5])


def test_an_end_comes_after_the_tokens_already_in() -> None:
    async def scenario() -> tuple[list[int], object]:
        s = TokenStream(interval=8)
        s.push(_ev(0), 1.0)
        await s.take()
        s.push(_ev(1), 2.0)  # held by the interval
        s.close(Drop("r", "preempted"))
        events, _ = await s.take()
        with pytest.raises(Ended) as end:
            await s.take()
        return [e.index for e in events], end.value.why

    indices, why = asyncio.run(scenario())
    assert indices == [1] and isinstance(why, Drop) and why.reason == "preempted"


def test_a_cancel_wakes_a_waiting_taker() -> None:
    async def scenario() -> object:
        s = TokenStream()
        task = asyncio.ensure_future(s.take())
        await asyncio.sleep(0)
        s.close(None)
        with pytest.raises(Ended) as end:
            await task
        return end.value.why

    assert asyncio.run(scenario()) is None


def test_an_interval_below_one_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="stream_interval"):
        TokenStream(interval=0)
