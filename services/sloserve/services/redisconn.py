"""Redis as a dependency that comes and goes.

Every service's Redis client comes from :func:`connect`; every background Redis
loop survives errors through an :class:`Outage`: the first error of an outage
is logged once (``redis_unavailable``), attempts are retried with capped
exponential backoff (redis-py's ``Retry``, retrying for ever), and the end of
the outage is logged once (``redis_back``, with its length). No Redis error
ends a process.

Commands themselves are not retried by the client (``retries=0``): a pipeline
whose reply was lost may already have run, and re-sending it would repeat a
non-idempotent ``RPUSH``. The loop that owns the write decides what to send
again (the scheduler's state writer resends an idempotent snapshot).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import RedisError

T = TypeVar("T")
BACKOFF_BASE_S = 0.05  # first retry after 0.1 s, doubling ...
BACKOFF_CAP_S = 1.0  # ... to at most 1 s: back within a second of Redis returning
CONNECT_TIMEOUT_S = 1.0
HEALTH_CHECK_S = 2  # an idle pooled connection is PINGed before reuse (a dead one is replaced)
REDIS_ERRORS: tuple[type[RedisError], ...] = (RedisError,)


def connect(url: str) -> aioredis.Redis:
    """A client that fails fast (no command retries, 1 s connect timeout) and
    reconnects on the next command: the loops using it own retries."""
    client: aioredis.Redis = aioredis.Redis.from_url(
        url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
    )
    return client


class Outage:
    """One loop's view of Redis availability: logs each outage once, paces retries."""

    def __init__(self, task: str, log: Any = None,
                 cap: float = BACKOFF_CAP_S) -> None:
        self.task = task
        self.log = log or structlog.get_logger()
        self.backoff = ExponentialBackoff(cap=cap, base=BACKOFF_BASE_S)
        self.since: float | None = None  # monotonic start of the current outage
        self.failures = 0  # in the current outage
        self.outages = 0  # since start

    @property
    def down(self) -> bool:
        return self.since is not None

    async def failed(self, exc: Exception) -> None:
        """An attempt failed (``Retry``'s failure hook): log it if the outage is new."""
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            self.outages += 1
            self.log.warning("redis_unavailable", task=self.task,
                             error=f"{type(exc).__name__}: {exc}")

    def delay(self) -> float:
        """Seconds to wait before the next attempt."""
        return float(self.backoff.compute(self.failures))

    def ok(self) -> None:
        """An attempt succeeded: end the outage, if there was one."""
        if self.since is not None:
            self.log.info("redis_back", task=self.task,
                          down_s=round(time.monotonic() - self.since, 3), attempts=self.failures)
        self.since, self.failures = None, 0

    async def until_ok(self, do: Callable[[], Awaitable[T]]) -> T:
        """``await do()`` until it succeeds, retrying Redis errors with backoff, for ever."""
        retry = Retry(self.backoff, -1, REDIS_ERRORS)
        result = await retry.call_with_retry(do, self.failed)
        self.ok()
        return result
