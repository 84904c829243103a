"""The token path (issue 33, item 3) with a restored request (issue 34, item 6) and
per-token logprobs (issue 35): a re-attached request's earlier tokens leave as one
Delta from ``start``, its live ones as the stream interval groups them, each with its
logprobs; the wire and SSE shapes carry every token's logprobs."""

from __future__ import annotations

import asyncio
import json

from sloserve.controller import Controller
from sloserve.services.gateway.openai_http import Choice, Shapes, _event
from sloserve.services.gateway.openai_surface import Surface
from sloserve.services.gateway.server import (
    Delta,
    GatewayService,
    _multi_chunk,
    _single_chunks,
)
from sloserve.services.proto import common_pb2, executor_pb2, scheduler_pb2


def _gateway(interval: int) -> GatewayService:
    desc = executor_pb2.ExecutorDescription(max_context=4096, kv_capacity_blocks=64,
                                            block_size=16)
    gw = GatewayService(Controller([("lp0", "lp")]),
                        {"lp0": scheduler_pb2.SchedulerStatus(role="lp", executor=desc)},
                        {"lp0": "127.0.0.1:9"}, {})
    gw.stream_interval = interval
    return gw


def _lp(v: float) -> common_pb2.TokenLogprobs:
    return common_pb2.TokenLogprobs(logprob=v, rank=1)


def test_a_reattached_request_replays_from_start_then_groups_live_tokens() -> None:
    async def scenario() -> list[Delta]:
        gw = _gateway(interval=2)
        spec = common_pb2.RequestSpec(request_id="r", prompt_token_ids=[1, 2], max_tokens=6,
                                      generated_token_ids=[70, 71, 72])
        gw.on_output("lp0", scheduler_pb2.SchedulerOutput(restored=[spec]))
        f = gw.attach("", "r", 1)
        it = gw.tokens(f, 1)
        got = [await anext(it)]  # the backlog from index 1, at once
        gw.on_output("lp0", scheduler_pb2.SchedulerOutput(tokens=[
            scheduler_pb2.TokenEvent(request_id="r", index=3, token_id=73, logprobs=_lp(-.5)),
            scheduler_pb2.TokenEvent(request_id="r", index=4, token_id=74, logprobs=_lp(-.25)),
            scheduler_pb2.TokenEvent(request_id="r", index=5, token_id=75, logprobs=_lp(-1.0),
                                     finished=True)]))
        got += [d async for d in it]
        return got

    got = asyncio.run(scenario())
    assert [(d.index, d.token_ids) for d in got] == [(1, [71, 72]), (3, [73, 74, 75])]
    assert got[0].logprobs == [None, None]
    assert [lp.logprob for lp in got[1].logprobs if lp is not None] == [-.5, -.25, -1.0]
    assert got[-1].finish_reason == "length"
    assert all(len(d.times) == len(d.token_ids) == len(d.texts) for d in got)


def _delta() -> Delta:
    return Delta(3, [73, 74], ["a", "b"], [1.0, 2.0], [0.5, 1.5], "", "lp0", 0,
                 [None, _lp(-.25)])


def test_the_wire_carries_each_tokens_logprobs() -> None:
    from sloserve.controller import Request
    from sloserve.services.gateway.server import Flight
    from sloserve.services.gateway.stream import TokenStream

    f = Flight(common_pb2.RequestSpec(request_id="r"), Request("r", 0.0, 1, 5), TokenStream(),
               client_id="r")
    multi = _multi_chunk(f, _delta())
    assert list(multi.token_ids) == [73, 74]
    assert [lp.logprob for lp in multi.token_logprobs] == [0.0, -.25]  # empty: none
    single = _single_chunks(f, _delta())
    assert [c.HasField("logprobs") for c in single] == [False, True]
    plain = _multi_chunk(f, Delta(0, [1], ["x"], [1.0], [1.0], "", "lp0", 0, [None]))
    assert not plain.token_logprobs


def test_one_sse_event_per_delta_with_its_tokens_logprobs_and_usage() -> None:
    from sloserve.controller import Request
    from sloserve.services.gateway.server import Flight
    from sloserve.services.gateway.stream import TokenStream

    spec = common_pb2.RequestSpec(request_id="r", prompt_token_ids=[1, 2, 3])
    f = Flight(spec, Request("r", 0.0, 1, 5), TokenStream(), client_id="r")

    async def none() -> object:
        raise StopAsyncIteration
        yield

    c = Choice(0, f, none())  # type: ignore[arg-type]
    shapes = Shapes(False, "r", "m", Surface(top_logprobs=0), lambda t: f"<{t}>")
    ev = _event(shapes, c, _delta(), False, True, with_ids=True)
    assert ev is not None
    obj = json.loads(ev[len(b"data: "):])
    choice = obj["choices"][0]
    assert choice["text"] == "ab" and choice["token_ids"] == [73, 74]
    assert choice["logprobs"]["tokens"] == ["<74>"]
    assert obj["usage"]["completion_tokens"] == 2 and c.n_tokens == 2
