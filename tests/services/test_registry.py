"""The instance registry in Redis (issue 34, item 2): registration, heartbeats with a TTL,
clean deregistration, and the join/leave events a watcher derives, on the real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis.asyncio as aioredis
from redis_source import redis_url

from sloserve.services.registry import (
    Heartbeat,
    Joined,
    Left,
    Member,
    Registry,
    Watch,
    advertise_address,
)

TTL = 0.6


Body = Callable[[aioredis.Redis, str], Awaitable[None]]


@pytest.fixture
def run() -> Iterator[Callable[[Body], None]]:
    """Runs a test body on the real Redis under a fresh prefix; the prefix's keys are
    deleted after."""
    prefix = f"sloserve-test:{uuid.uuid4().hex[:10]}"

    async def go(body: Body) -> None:
        r = aioredis.Redis.from_url(redis_url())
        try:
            await body(r, prefix)
        finally:
            keys = [k async for k in r.scan_iter(f"{prefix}:*")]
            if keys:
                await r.delete(*keys)
            await r.aclose()

    yield lambda body: asyncio.run(go(body))


def ids(events: list[Joined | Left]) -> list[tuple[str, str, str]]:
    return [
        (type(e).__name__, e.member.id, e.reason if isinstance(e, Left) else "") for e in events
    ]


def test_a_registered_member_joins_and_a_deregistered_one_leaves(
    run: Callable[[Body], None],
) -> None:
    async def body(r: aioredis.Redis, prefix: str) -> None:
        reg = Registry(r, prefix, "scheduler", TTL)
        watch = Watch(reg)
        lp0 = Member("scheduler", "lp0", "10.0.0.2:7000", role="lp", meta={"executor": "x:1"})
        beat = await Heartbeat(reg, lp0).start()
        await asyncio.sleep(0.05)
        assert ids(await watch.poll()) == [("Joined", "lp0", "")]
        assert watch.known["lp0"] == lp0  # address, role and meta as registered
        await asyncio.sleep(TTL * 2)  # heartbeats keep it alive past its TTL
        assert await watch.poll() == []
        await beat.leave()
        assert ids(await watch.poll()) == [("Left", "lp0", "deregistered")]
        assert await watch.poll() == []

    run(body)


def test_a_member_whose_heartbeats_stop_expires_and_leaves(run: Callable[[Body], None]) -> None:
    async def body(r: aioredis.Redis, prefix: str) -> None:
        reg = Registry(r, prefix, "scheduler", TTL)
        watch = Watch(reg)
        await reg.register(Member("scheduler", "lp1", "10.0.0.3:7000", role="lp"))  # one beat
        assert ids(await watch.poll()) == [("Joined", "lp1", "")]
        await asyncio.sleep(TTL + 0.2)
        assert ids(await watch.poll()) == [("Left", "lp1", "expired")]
        assert await r.smembers(reg.set_key) == set()  # the expired id is taken out

    run(body)


def test_a_redis_that_loses_the_entries_is_no_leave_within_the_ttl(
    run: Callable[[Body], None],
) -> None:
    async def body(r: aioredis.Redis, prefix: str) -> None:
        reg = Registry(r, prefix, "scheduler", TTL * 3)
        watch = Watch(reg)
        beat = await Heartbeat(reg, Member("scheduler", "lp0", "h:2")).start()
        await asyncio.sleep(0.05)
        assert ids(await watch.poll()) == [("Joined", "lp0", "")]
        await r.delete(reg.key("lp0"), reg.set_key)  # Redis restarted empty
        assert await watch.poll() == []  # not a TTL unseen: no leave
        await asyncio.sleep(TTL * 3 / 4 + 0.2)  # the next heartbeat writes it again
        assert await watch.poll() == [] and "lp0" in await reg.members()
        await beat.leave()

    run(body)


def test_a_restart_at_the_same_address_is_no_event_a_new_address_is_leave_then_join(
    run: Callable[[Body], None],
) -> None:
    async def body(r: aioredis.Redis, prefix: str) -> None:
        reg = Registry(r, prefix, "scheduler", TTL)
        watch = Watch(reg)
        await reg.register(Member("scheduler", "lp0", "10.0.0.2:7000"))
        await watch.poll()
        await reg.register(Member("scheduler", "lp0", "10.0.0.2:7000"))  # a new incarnation
        assert await watch.poll() == []
        await reg.register(Member("scheduler", "lp0", "10.0.0.9:7000"))
        assert ids(await watch.poll()) == [("Left", "lp0", "moved"), ("Joined", "lp0", "")]
        assert watch.known["lp0"].address == "10.0.0.9:7000"

    run(body)


def test_an_old_incarnation_cannot_deregister_its_successor(run: Callable[[Body], None]) -> None:
    async def body(r: aioredis.Redis, prefix: str) -> None:
        reg = Registry(r, prefix, "scheduler", TTL * 10)
        old = Member("scheduler", "lp0", "10.0.0.2:7000")
        new = Member("scheduler", "lp0", "10.0.0.2:7000")
        await reg.register(old)
        await reg.register(new)  # restarted before the old process's stop ran
        await reg.deregister(old)
        assert (await reg.members())["lp0"].state == "up"

    run(body)


def test_pinned_members_and_other_kinds_are_not_reported(run: Callable[[Body], None]) -> None:
    async def body(r: aioredis.Redis, prefix: str) -> None:
        await Registry(r, prefix, "executor", TTL).register(Member("executor", "e", "h:1"))
        reg = Registry(r, prefix, "scheduler", TTL)
        await reg.register(Member("scheduler", "lp0", "h:2"))
        await reg.register(Member("scheduler", "lp1", "h:3"))
        assert ids(await Watch(reg, pinned=frozenset({"lp0"})).poll()) == [("Joined", "lp1", "")]

    run(body)


def test_a_redis_outage_is_no_leave(run: Callable[[Body], None]) -> None:
    async def body(r: aioredis.Redis, prefix: str) -> None:
        reg = Registry(r, prefix, "scheduler", TTL * 10)
        watch = Watch(reg)
        await reg.register(Member("scheduler", "lp0", "h:2"))
        await watch.poll()
        dead = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
        watch.registry = Registry(dead, prefix, "scheduler", TTL * 10)
        assert await watch.poll() == [] and set(watch.known) == {"lp0"}
        await dead.aclose()

    run(body)


def test_the_advertised_address_is_the_flag_else_the_bound_one() -> None:
    assert advertise_address("10.1.0.2", 50061, None) == "10.1.0.2:50061"
    assert advertise_address("0.0.0.0", 50061, "sched-a.svc") == "sched-a.svc:50061"
    assert advertise_address("0.0.0.0", 50061, "10.2.0.5:9000") == "10.2.0.5:9000"
    assert advertise_address("::", 7, "[fd00::5]") == "[fd00::5]:7"
    assert advertise_address("::", 7, "[fd00::5]:8") == "[fd00::5]:8"
    host = advertise_address("0.0.0.0", 50061, None)
    assert not host.startswith("0.0.0.0") and host.endswith(":50061")  # the machine's name


def test_a_bad_ttl_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--registry-ttl"):
        Registry(None, "p", "scheduler", 0)  # type: ignore[arg-type]


def test_a_gateway_with_no_scheduler_registered_or_a_bad_registry_flag_fails_naming_it() -> None:
    import subprocess
    import sys

    prefix = f"sloserve-test:{uuid.uuid4().hex[:10]}"
    base = [sys.executable, "-m", "sloserve.services.gateway", "--port", "0", "--prefix", prefix]
    for extra, said in (
        (["--min-instances", "0"], "--min-instances: must be >= 1, got 0"),
        (["--registry-ttl", "0"], "--registry-ttl: must be > 0, got 0"),
        (
            ["--connect-timeout", "0.5"],
            f"--min-instances: 0 of 1 schedulers registered in Redis ({prefix}:registry:scheduler)",
        ),
    ):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]
