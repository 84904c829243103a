"""A whole-stack restart on the same Redis and prefix (issue 34, item 6): every accepted
request resumes (its client re-attaches by request id and gets the rest of its stream) or
ends with a status its client can fetch and a log line, never silently."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from sloserve.services.drills.restart import drill
from sloserve.services.stack import Stack

N, MAX_TOKENS = 30, 150


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_after_a_whole_stack_restart_every_client_reattaches_and_gets_the_rest_of_its_stream(
    start_stack: Callable[..., Stack],
    sig: int,
) -> None:
    stack = start_stack(policy="sarathi", instances=2, time_scale=2.0)
    outcomes, down = drill(stack, N, MAX_TOKENS, sig)
    print(f"down {down:.1f}s; before the restart: {sorted(o.before for o in outcomes)}")
    assert all(0 < o.before < MAX_TOKENS for o in outcomes)  # every one cut mid-stream
    assert [o.row() for o in outcomes if not (o.resumed and o.logged)] == []
    sched = (stack.cfg.log_dir / "scheduler-lp0.log").read_text()  # type: ignore[operator]
    assert '"restored_offered"' in sched


def test_a_restored_request_nobody_reattaches_to_ends_with_a_status_and_a_log_line(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(policy="sarathi", instances=2, time_scale=2.0)

    def short_grace(s: Stack) -> None:  # the gateway gives up on them after 1 s
        s.plan = _with_gateway_flags(s, "--reattach-grace", "1")  # type: ignore[method-assign]

    outcomes, _ = drill(
        stack,
        6,
        MAX_TOKENS,
        signal.SIGTERM,
        prefix="late",
        attach_after_s=3.0,
        on_restart=short_grace,
    )
    for o in outcomes:
        assert not o.resumed
        assert o.status.startswith("ABORTED: request late-"), o.status
        assert "not re-attached within 1 s" in o.status
        assert o.logged, o.request_id


def _with_gateway_flags(stack: Stack, *flags: str) -> Callable[[], None]:
    plan = stack.plan

    def planned() -> None:
        plan()
        stack.services["gateway"].argv += list(flags)

    return planned


def test_http_clients_reattach_with_get_and_starting_after(
    start_stack: Callable[..., Stack],
) -> None:
    """``GET /v1/completions/{id}?stream=true&starting_after=N`` (SSE) and without
    ``stream`` (the whole object); an unknown id is a 404 in OpenAI's error shape."""
    import json

    import httpx

    from sloserve.services.drills.restart import Outcome
    from sloserve.services.store import free_port

    stack = start_stack(policy="sarathi", instances=2, time_scale=2.0, http_port=free_port())

    def over_http(s: Stack, outcomes: list[Outcome], max_tokens: int) -> None:
        with httpx.Client(base_url=s.http, timeout=120) as http:
            for k, o in enumerate(outcomes):
                url = f"/v1/completions/cmpl-{o.request_id}"
                params = {"starting_after": str(o.before - 1)}
                for _ in range(100):  # 503 while the gateway reconnects to its instances
                    if k % 2:
                        r = http.get(url, params=params)
                    else:
                        r = http.get(url, params={**params, "stream": "true"})
                    if r.status_code != 503:
                        break
                assert r.status_code == 200, r.text
                if k % 2:
                    body = r.json()
                    finish = body["choices"][0]["finish_reason"]
                    n = body["usage"]["completion_tokens"]
                else:
                    events = [
                        json.loads(line[6:])
                        for line in r.text.splitlines()
                        if line.startswith("data: {")
                    ]
                    assert r.text.rstrip().endswith("data: [DONE]")
                    finish, n = events[-1]["choices"][0]["finish_reason"], max_tokens
                o.resumed = finish == "length" and n == max_tokens
            missing = http.get("/v1/completions/cmpl-nobody")
            assert missing.status_code == 404
            assert missing.json()["error"]["message"].startswith("request_id: 'nobody'")

    outcomes, _ = drill(stack, 4, MAX_TOKENS, signal.SIGTERM, prefix="http", reattach=over_http)
    assert [o.row() for o in outcomes if not (o.resumed and o.logged)] == []


def _gateway() -> object:
    from sloserve.controller import Controller
    from sloserve.services.gateway.server import GatewayService
    from sloserve.services.proto import executor_pb2, scheduler_pb2

    desc = executor_pb2.ExecutorDescription(max_context=4096, kv_capacity_blocks=64, block_size=16)
    return GatewayService(
        Controller([("lp0", "lp")]),
        {"lp0": scheduler_pb2.SchedulerStatus(role="lp", executor=desc)},
        {"lp0": "127.0.0.1:9"},
        {},
    )


def test_a_request_complete_in_redis_is_offered_and_replayed_from_the_index_asked() -> None:
    """A request whose every token reached Redis before the crash (its end not recorded)
    is adopted complete: Attach replays from ``start_index`` and ends with ``length``;
    an index past max_tokens is refused naming the field."""
    import asyncio

    import grpc

    from sloserve.services.gateway.server import GatewayError, GatewayService
    from sloserve.services.proto import common_pb2, scheduler_pb2

    async def scenario() -> None:
        gw = _gateway()
        assert isinstance(gw, GatewayService)
        spec = common_pb2.RequestSpec(
            request_id="done",
            prompt_token_ids=[1, 2],
            max_tokens=5,
            generated_token_ids=[70, 71, 72, 73, 74],
        )
        gw.on_output("lp0", scheduler_pb2.SchedulerOutput(restored=[spec]))
        with pytest.raises(GatewayError) as bad:
            gw.attach("", "done", 6)
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert bad.value.message.startswith("start_index:")
        f = gw.attach("", "done", 2)
        got = [d async for d in gw.tokens(f, 2)]  # the backlog leaves as one Delta
        assert [(d.index + i, t) for d in got for i, t in enumerate(d.token_ids)] == [
            (2, 72), (3, 73), (4, 74)]
        assert [d.index for d in got] == [2]
        assert got[-1].finish_reason == "length"
        with pytest.raises(GatewayError) as gone:  # delivered: the gateway holds it no more
            gw.attach("", "done", 0)
        assert gone.value.code == grpc.StatusCode.NOT_FOUND

    asyncio.run(scenario())


def test_a_restored_request_past_its_grace_is_cancelled_and_attach_says_so() -> None:
    import asyncio
    import time

    import grpc

    from sloserve.services.gateway.server import GatewayError, GatewayService
    from sloserve.services.proto import common_pb2, scheduler_pb2

    async def scenario() -> None:
        gw = _gateway()
        assert isinstance(gw, GatewayService)
        spec = common_pb2.RequestSpec(
            request_id="late", prompt_token_ids=[1, 2], max_tokens=50, generated_token_ids=[70, 71]
        )
        gw.on_output("lp0", scheduler_pb2.SchedulerOutput(restored=[spec]))
        assert gw.ctl.location["late"] == "lp0"
        gw.expire(time.monotonic() + gw.reattach_grace - 1)  # not yet
        assert "late" in gw.flights
        gw.expire(time.monotonic() + gw.reattach_grace + 1)
        assert "late" not in gw.flights and "late" not in gw.ctl.location
        with pytest.raises(GatewayError) as ended:
            gw.attach("", "late", 2)
        assert ended.value.code == grpc.StatusCode.ABORTED
        assert "not re-attached within 300 s: cancelled after 2 of 50 tokens" in ended.value.message

    asyncio.run(scenario())
