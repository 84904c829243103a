"""The scheduler's state writer through a Redis outage: writes that failed are replaced
by an idempotent snapshot of the live requests once Redis is back, so Redis holds
exactly what a restarted scheduler needs, even when it came back empty."""

from __future__ import annotations

import asyncio

from sloserve.services.drills.redis_server import ThrowawayRedis
from sloserve.services.proto import common_pb2
from sloserve.services.redisconn import connect
from sloserve.services.scheduler.state import RequestStore
from sloserve.services.store import Keys


def _spec(rid: str, at: float) -> common_pb2.RequestSpec:
    return common_pb2.RequestSpec(request_id=rid, prompt_token_ids=[1, 2], max_tokens=8,
                                  arrival_time=at)


def test_writer_resends_a_snapshot_of_live_requests_after_an_outage(
    throwaway_redis: ThrowawayRedis,
) -> None:
    async def scenario() -> list[tuple[str, list[int]]]:
        store = RequestStore(connect(throwaway_redis.url), Keys("snap"), "lp0")
        live: dict[str, tuple[common_pb2.RequestSpec, list[int]]] = {}
        store.live = lambda: list(live.values())
        writer = asyncio.create_task(store.flush_forever())
        for rid, at in (("a", 1.0), ("b", 2.0), ("gone", 0.5)):
            live[rid] = (_spec(rid, at), [])
            store.accept(live[rid][0])
        store.append_tokens({"a": 10, "b": 20})
        live["a"][1].append(10)
        live["b"][1].append(20)
        await store.flush()  # all of it is in Redis
        throwaway_redis.kill()
        store.append_tokens({"a": 11})  # while Redis is down: a token, a finished request
        live["a"][1].append(11)
        store.forget("gone")
        del live["gone"]
        store.kick(1e9, 0.0)
        while store.outage.since is None:
            await asyncio.sleep(0.05)
        throwaway_redis.start()  # empty: no persistence
        while store.outage.down or store.dirty:
            await asyncio.sleep(0.05)
        writer.cancel()
        assert store.snapshots == 1
        return [(spec.request_id, toks) for spec, toks in await store.restore()]

    assert asyncio.run(scenario()) == [("a", [10, 11]), ("b", [20])]


def test_snapshot_removes_requests_redis_still_lists_but_that_are_gone(
    throwaway_redis: ThrowawayRedis,
) -> None:
    async def scenario() -> list[str]:
        store = RequestStore(connect(throwaway_redis.url), Keys("snap2"), "lp0")
        store.accept(_spec("stale", 1.0))
        store.accept(_spec("kept", 2.0))
        await store.flush()
        store.live = lambda: [(_spec("kept", 2.0), [5])]
        await store.snapshot()
        return [spec.request_id for spec, _ in await store.restore()]

    assert asyncio.run(scenario()) == ["kept"]
