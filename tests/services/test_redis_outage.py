"""Redis is a dependency that comes and goes: killed for a few seconds mid-run, with
50 streams in flight, it costs no accepted request, no service process, and new
requests are served while it is down and right after it returns (docs/reliability.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from sloserve.client import Chunk, Client
from sloserve.services.drills.redis_server import ThrowawayRedis
from sloserve.services.drills.streams import start_streams
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.stack import Stack
from sloserve.services.store import Keys


@dataclass
class OutageRun:
    results: dict[int, list[Chunk]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    during_s: float = -1.0  # a request made while Redis was down: its completion time
    after_s: float = -1.0  # a request made right after Redis returned: its completion time
    durable_after_s: float = -1.0  # Redis lists the live requests again this long after


def _short(client: Client, rid: str) -> float:
    t0 = time.monotonic()
    chunks = list(client.generate(prompt_token_ids=[70] * 20, max_tokens=4, request_id=rid,
                                  ttft_slo=30.0, tbt_slo=30.0, timeout=30))
    assert [c.index for c in chunks] == [0, 1, 2, 3]
    return time.monotonic() - t0


def run_outage(stack: Stack, server: ThrowawayRedis, outage_s: float, n: int = 50,
               max_tokens: int = 150) -> OutageRun:
    """``n`` streams; once all have a first token, Redis is SIGKILLed for ``outage_s``
    (it comes back empty: no persistence), then started again on the same port."""
    client = Client(stack.gateway)
    run = OutageRun()
    streams = start_streams(client, n, max_tokens, "outage")
    run.results, run.errors = streams.results, streams.errors
    server.kill()
    t_down = time.monotonic()
    run.during_s = _short(client, "while-down")
    time.sleep(max(0.0, outage_s - (time.monotonic() - t_down)))
    server.start()
    t_up = time.monotonic()
    run.after_s = _short(client, "after-return")
    r = redis.Redis(port=server.port)
    queue = Keys(stack.prefix).queue("lp0")
    while time.monotonic() - t_up < 10 and not r.zcard(queue):
        time.sleep(0.05)
    if r.zcard(queue):
        run.durable_after_s = time.monotonic() - t_up
    r.close()
    streams.join()
    return run


def test_redis_killed_for_3s_under_50_streams_loses_nothing_and_no_service_exits(
    start_stack: Callable[..., Stack], throwaway_redis: ThrowawayRedis,
) -> None:
    stack = start_stack(policy="sarathi", redis_url=throwaway_redis.url, time_scale=3.0)
    max_tokens = 150
    run = run_outage(stack, throwaway_redis, outage_s=3.0, max_tokens=max_tokens)
    assert not run.errors, run.errors[:3]
    assert len(run.results) == 50
    for k, chunks in run.results.items():
        assert [c.token_id for c in chunks] == [
            pseudo_token(f"outage-{k}", i) for i in range(max_tokens)], k
        assert chunks[-1].finish_reason == "length"
    assert run.during_s < 5.0  # served from memory while Redis was down
    assert run.after_s < 5.0
    assert 0 <= run.durable_after_s < 5.0  # the scheduler's snapshot re-filled the empty Redis
    assert stack.exited() == []
    logs = stack.cfg.log_dir
    assert logs is not None
    sched = (logs / "scheduler-lp0.log").read_text()
    # each loop logs the outage once and its end once, not once per retry
    events = [json.loads(ln) for ln in sched.splitlines() if ln.startswith("{")]
    down = [e["task"] for e in events if e["event"] == "redis_unavailable"]
    back = [e["task"] for e in events if e["event"] == "redis_back"]
    assert down and len(down) == len(set(down)), down
    assert sorted(back) == sorted(down)
    for log in logs.glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name
