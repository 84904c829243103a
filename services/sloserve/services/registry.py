"""The instance registry in Redis (issue 34, item 2): who is in the deployment, and where.

Every service registers itself under its kind (``scheduler``, ``executor``,
``perfmodel``, ``gateway``) with the address others dial (``--advertise``) and keeps
its entry alive with heartbeats; an entry not refreshed for ``ttl_s`` expires in Redis
(its machine died or was cut off). A clean stop deregisters: the entry is marked
``leaving`` (kept for a TTL so every watcher sees why it went), then expires.

The process holding the Controller (the gateway, or a router) follows one kind with
:class:`Watch`, which turns snapshots into :class:`Joined` / :class:`Left` events; the
Controller's ``on_instance_joined`` / ``on_instance_left`` decide what they mean. A
scheduler restarted under the same id and address is the same member (no events: the
health watch and the ``Hello`` resync cover a restart); a new address is a leave and a
join. Redis being unreachable is no event: a watcher sees nobody leave while it cannot
look.

Keys (under the stack's prefix): ``<prefix>:registry:<kind>`` (a set of ids) and
``<prefix>:registry:<kind>:<id>`` (the member's JSON, with a TTL). Redis expires the
entries, so no two machines' clocks are compared.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from sloserve.services.redisconn import REDIS_ERRORS, Outage

DEFAULT_TTL_S = 10.0  # an entry lives this long past its last heartbeat
BEATS_PER_TTL = 4  # heartbeats per TTL: three may be lost before the entry expires
DEFAULT_POLL_S = 0.5  # a watcher's look at the registry
UP, LEAVING = "up", "leaving"
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True, slots=True)
class Member:
    """One registered service: what it is and the address others dial."""

    kind: str  # scheduler | executor | perfmodel | gateway
    id: str  # the instance id for a scheduler ("lp0"), else a name unique in its kind
    address: str  # host:port, as advertised
    role: str = ""  # a scheduler's "lp" | "hp"
    meta: dict[str, str] = field(default_factory=dict)  # e.g. a scheduler's executor
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # this process
    state: str = UP

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Member:
        d = json.loads(text)
        return cls(
            kind=str(d["kind"]),
            id=str(d["id"]),
            address=str(d["address"]),
            role=str(d.get("role", "")),
            meta=dict(d.get("meta", {})),
            incarnation=str(d.get("incarnation", "")),
            state=str(d.get("state", UP)),
        )


@dataclass(frozen=True, slots=True)
class Joined:
    member: Member


@dataclass(frozen=True, slots=True)
class Left:
    member: Member
    reason: str  # "deregistered" (a clean stop) | "expired" (no heartbeat for a TTL)


Event = Joined | Left


def advertise_address(host: str, port: int, advertise: str | None) -> str:
    """The address others dial: ``--advertise`` (``HOST`` or ``HOST:PORT``), else the bound
    ``host:port``; a wildcard bind (0.0.0.0, ::) is advertised under this machine's name."""
    if advertise:
        h, sep, p = advertise.rpartition(":")
        if sep and p.isdigit() and (h.endswith("]") or ":" not in h):
            return advertise
        return f"{advertise}:{port}"
    if host in WILDCARDS:
        host = socket.gethostname()
    return f"{host}:{port}"


def check_ttl(ttl_s: float) -> float:
    if not ttl_s > 0:
        raise ValueError(f"--registry-ttl: must be > 0 seconds, got {ttl_s}")
    return ttl_s


class Registry:
    """One kind's registry under ``prefix``: register, heartbeat, deregister, list."""

    def __init__(
        self, redis: aioredis.Redis, prefix: str, kind: str, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        self.redis, self.kind, self.ttl_s = redis, kind, check_ttl(ttl_s)
        self.set_key = f"{prefix}:registry:{kind}"

    def key(self, member_id: str) -> str:
        return f"{self.set_key}:{member_id}"

    async def register(self, member: Member) -> None:
        """Write (or refresh) ``member``'s entry; one heartbeat."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.key(member.id), member.to_json(), px=int(self.ttl_s * 1000))
            pipe.sadd(self.set_key, member.id)
            await pipe.execute()

    async def deregister(self, member: Member) -> None:
        """A clean stop: the entry says ``leaving`` until it expires (unless another
        process has taken the id since)."""
        current = await self.redis.get(self.key(member.id))
        if current is not None and Member.from_json(current).incarnation != member.incarnation:
            return
        leaving = replace(member, state=LEAVING)
        await self.redis.set(self.key(member.id), leaving.to_json(), px=int(self.ttl_s * 1000))

    async def members(self) -> dict[str, Member]:
        """Every entry still in Redis (``up`` or ``leaving``); ids whose entry expired are
        taken out of the set."""
        ids = sorted(
            m.decode() if isinstance(m, bytes) else str(m)
            for m in await self.redis.smembers(self.set_key)
        )
        if not ids:
            return {}
        values = await self.redis.mget([self.key(i) for i in ids])
        gone = [i for i, v in zip(ids, values) if v is None]
        if gone:
            await self.redis.srem(self.set_key, *gone)
        return {i: Member.from_json(v) for i, v in zip(ids, values) if v is not None}


class Heartbeat:
    """A service's registration, kept alive until :meth:`leave` (the shell's handle)."""

    def __init__(self, registry: Registry, member: Member, log: Any = None) -> None:
        self.registry, self.member = registry, member
        self.log = log or structlog.get_logger()
        self.outage = Outage(f"registry-{registry.kind}", self.log)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> Heartbeat:
        """Register now and beat in the background (a Redis outage delays the first
        registration, it does not hold up the service)."""
        self.task = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        every, registered = self.registry.ttl_s / BEATS_PER_TTL, False
        while True:
            try:
                await self.registry.register(self.member)
                self.outage.ok()
                if not registered:
                    registered = True
                    self.log.info(
                        "registered",
                        kind=self.member.kind,
                        id=self.member.id,
                        address=self.member.address,
                        ttl_s=self.registry.ttl_s,
                    )
            except REDIS_ERRORS as exc:
                await self.outage.failed(exc)
            await asyncio.sleep(every if not self.outage.down else self.outage.delay())

    async def leave(self, timeout: float = 1.0) -> None:
        """Stop beating and deregister (best effort within ``timeout``: an entry that
        cannot be marked expires on its own)."""
        if self.task is not None:
            self.task.cancel()
            self.task = None
        try:
            await asyncio.wait_for(self.registry.deregister(self.member), timeout)
            self.log.info("deregistered", kind=self.member.kind, id=self.member.id)
        except (TimeoutError, RedisError) as exc:
            self.log.warning("deregister_failed", id=self.member.id, error=str(exc))


def diff(
    known: dict[str, Member], seen: dict[str, Member]
) -> tuple[list[Event], dict[str, Member]]:
    """The events that take ``known`` (the members a watcher acts on) to ``seen`` (the
    registry's entries), and the new ``known``. Leaves come first (an address change is a
    leave then a join)."""
    events: list[Event] = []
    now = {i: m for i, m in seen.items() if m.state == UP}
    for i, m in known.items():
        new = now.get(i)
        if new is None:
            reason = "deregistered" if i in seen else "expired"
            events.append(Left(m, reason))
        elif new.address != m.address:
            events.append(Left(m, "moved"))
    for i, m in now.items():
        old = known.get(i)
        if old is None or old.address != m.address:
            events.append(Joined(m))
    return events, {i: now[i] for i in now}


class Watch:
    """Follows one kind: polls the registry every ``poll_s`` and yields events. Members
    in ``pinned`` (a static ``--scheduler`` list) are never reported.

    An entry that vanished without saying ``leaving`` has expired only once this watcher
    has not seen it for a whole TTL (on its own clock): before that, Redis lost it
    (restarted empty, or a failover dropped the last writes) and the member's next
    heartbeat writes it again, so a Redis that comes back empty is no leave."""

    def __init__(
        self,
        registry: Registry,
        poll_s: float = DEFAULT_POLL_S,
        pinned: frozenset[str] = frozenset(),
        log: Any = None,
    ) -> None:
        self.registry, self.poll_s, self.pinned = registry, poll_s, pinned
        self.known: dict[str, Member] = {}
        self.seen_at: dict[str, float] = {}  # member -> when this watcher last saw its entry
        self.log = log or structlog.get_logger()
        self.outage = Outage(f"registry-watch-{registry.kind}", self.log)

    async def poll(self) -> list[Event]:
        """One look (a Redis error: no events, the same ``known``)."""
        try:
            seen = await self.registry.members()
            self.outage.ok()
        except REDIS_ERRORS as exc:
            await self.outage.failed(exc)
            return []
        seen = {i: m for i, m in seen.items() if i not in self.pinned}
        now = time.monotonic()
        self.seen_at.update(dict.fromkeys(seen, now))
        for i, m in self.known.items():
            if i not in seen and now - self.seen_at.get(i, now) < self.registry.ttl_s:
                seen[i] = m  # not expired yet: lost by Redis, or a heartbeat is late
        events, self.known = diff(self.known, seen)
        for i in [i for i in self.seen_at if i not in seen]:
            del self.seen_at[i]
        return events

    async def events(self) -> AsyncIterator[Event]:
        while True:
            for ev in await self.poll():
                yield ev
            await asyncio.sleep(self.poll_s if not self.outage.down else self.outage.delay())

    async def follow(self, on_event: Callable[[Event], Awaitable[None]]) -> None:
        """Hand every event to ``on_event``, in order, for ever."""
        async for ev in self.events():
            await on_event(ev)


async def announce(
    redis: aioredis.Redis,
    args: Any,
    kind: str,
    member_id: str | None = None,
    role: str = "",
    meta: dict[str, str] | None = None,
    log: Any = None,
) -> Heartbeat:
    """Register a service started with the common flags (``--host``, ``--port``,
    ``--advertise``, ``--prefix``, ``--registry-ttl``) and keep it alive; ``member_id``
    defaults to its advertised address."""
    address = advertise_address(args.host, args.port, args.advertise)
    member = Member(kind, member_id or address, address, role=role, meta=meta or {})
    registry = Registry(redis, args.prefix, kind, args.registry_ttl)
    return await Heartbeat(registry, member, log).start()
