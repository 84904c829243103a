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

A ``redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]`` URL (issue 34, item 3)
gives a client of redis-py's Sentinel: each new connection asks the sentinels for the
current master, and a connection that fails (the master died, or was demoted:
``READONLY``) is dropped, so the loops' next attempt after a failover reaches the
promoted replica. A password in the URL is the master's (and replicas'); the sentinels
are asked without one.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import redis
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
SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379  # a sentinel's port where the URL names none
SENTINEL_TIMEOUT_S = 1.0  # a sentinel that does not answer within this is skipped


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]``."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    @staticmethod
    def is_sentinel(url: str) -> bool:
        return url.lower().startswith(SENTINEL_SCHEME + "://")

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """The URL's parts; ``ValueError`` saying what is wrong (never echoing a password)."""
        if not cls.is_sentinel(url):
            raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
        rest = url[len(SENTINEL_SCHEME) + 3:]
        if "?" in rest or "#" in rest:
            raise ValueError(f"{SENTINEL_SCHEME}:// takes no query string or fragment")
        netloc, _, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        username = password = None
        if at:
            user, colon, pw = userinfo.partition(":")
            username = unquote(user) or None
            password = unquote(pw) if colon else None
        sentinels = tuple(_host_port(h) for h in hosts.split(",")) if hosts else ()
        if not sentinels:
            raise ValueError("names no sentinel (HOST:PORT[,HOST:PORT...] before the "
                             "master's name)")
        parts = path.split("/") if path else []
        if parts and parts[-1] == "":
            parts.pop()  # a trailing slash
        if not parts or not parts[0]:
            raise ValueError("names no master (…/MASTER_NAME[/DB] after the sentinels)")
        if len(parts) > 2:
            raise ValueError(f"path {'/' + path!r} has more than /MASTER_NAME/DB")
        db = 0
        if len(parts) == 2:
            if not parts[1].isdigit():
                raise ValueError(f"database {parts[1]!r} is not a non-negative integer")
            db = int(parts[1])
        return cls(sentinels, unquote(parts[0]), db, username, password)

    def _kwargs(self, retry: Any) -> dict[str, Any]:
        # one attempt per sentinel per ask (``retry``: redis-py's default retries with
        # backoff would spend seconds on a dead one before the next is asked; our loops
        # own retries)
        return {"sentinel_kwargs": {"socket_connect_timeout": SENTINEL_TIMEOUT_S,
                                    "socket_timeout": SENTINEL_TIMEOUT_S, "retry": retry},
                "db": self.db, "username": self.username, "password": self.password}

    def async_client(self, **kwargs: Any) -> aioredis.Redis:
        """The master's client (``redis.asyncio.sentinel``); ``kwargs`` as for any client."""
        from redis.asyncio.sentinel import Sentinel

        kw = self._kwargs(Retry(NoBackoff(), 0))
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(self.sentinels), sentinel_kwargs=kw.pop("sentinel_kwargs"))
        client: aioredis.Redis = sentinel.master_for(self.master, **kw, **kwargs)
        return client

    def sync_client(self, **kwargs: Any) -> redis.Redis:
        """The same, synchronous (``redis.sentinel``)."""
        from redis.retry import Retry as SyncRetry
        from redis.sentinel import Sentinel

        kw = self._kwargs(SyncRetry(NoBackoff(), 0))
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(self.sentinels), sentinel_kwargs=kw.pop("sentinel_kwargs"))
        client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            self.master, **kw, **kwargs)
        return client


def _host_port(text: str) -> tuple[str, int]:
    host, port = text, str(SENTINEL_PORT)
    if text.startswith("["):  # [IPv6]:PORT
        end = text.find("]")
        host, tail = text[1:end], text[end + 1:] if end > 0 else ""
        if end < 0 or (tail and not tail.startswith(":")):
            raise ValueError(f"sentinel {text!r} is not HOST:PORT")
        port = tail[1:] or port
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if not host:
        raise ValueError(f"sentinel {text!r} has no host")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"sentinel {text!r}: port {port!r} is not 1-65535")
    return host, int(port)


def check_url(url: str) -> None:
    """``ValueError`` if ``url`` is a sentinel URL that does not parse (other schemes are
    left to redis-py's own parser, which refuses them when the client is made)."""
    if SentinelURL.is_sentinel(url):
        SentinelURL.parse(url)


def url_arg(text: str) -> str:
    """argparse type of ``--redis-url``: a malformed sentinel URL is refused, the message
    naming ``$REDIS_URL`` when the flag's value is its default from there."""
    import argparse
    import os

    try:
        check_url(text)
    except ValueError as exc:
        source = " ($REDIS_URL)" if text == os.environ.get("REDIS_URL") else ""
        raise argparse.ArgumentTypeError(f"{SENTINEL_SCHEME} URL{source}: {exc}") from None
    return text


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A synchronous client for ``url`` (``redis://``, ``rediss://``, ``redis+sentinel://``)."""
    if SentinelURL.is_sentinel(url):
        return SentinelURL.parse(url).sync_client(**kwargs)
    client: redis.Redis = redis.Redis.from_url(url, **kwargs)
    return client


def connect(url: str) -> aioredis.Redis:
    """A client that fails fast (no command retries, 1 s connect timeout) and
    reconnects on the next command: the loops using it own retries. Behind a sentinel
    URL, each reconnection asks the sentinels for the current master."""
    kwargs: dict[str, Any] = {"retry": Retry(NoBackoff(), 0),
                              "socket_connect_timeout": CONNECT_TIMEOUT_S,
                              "health_check_interval": HEALTH_CHECK_S}
    if SentinelURL.is_sentinel(url):
        return SentinelURL.parse(url).async_client(**kwargs)
    client: aioredis.Redis = aioredis.Redis.from_url(url, **kwargs)
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
