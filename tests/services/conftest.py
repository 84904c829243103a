"""Live-stack fixtures: real service processes on fresh loopback ports, real Redis.

Every stack gets its own Redis key prefix and is torn down (processes and
keys) by the fixture's finalizer.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis_source import redis_url

from sloserve.services.drills.redis_server import ThrowawayRedis
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port

REDIS_URL = redis_url()  # the session's one Redis (tests/redis_source.py)


@pytest.fixture
def start_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def start(**kw: object) -> Stack:
        opts: dict[str, object] = dict(
            gateway_port=free_port(), redis_url=REDIS_URL,
            prefix=f"sloserve-test:{uuid.uuid4().hex[:10]}",
            log_dir=tmp_path / f"logs{len(stacks)}", refit_interval=0.5)
        cfg = StackConfig(**{**opts, **kw})  # type: ignore[arg-type]
        stack = Stack(cfg)
        stacks.append(stack)
        return stack.start()

    yield start
    r = redis.Redis.from_url(REDIS_URL)
    for s in stacks:
        s.stop()
        if s.redis_url != REDIS_URL:
            continue  # a throwaway Redis: gone with its test
        keys = list(r.scan_iter(f"{s.prefix}:*"))
        if keys:
            r.delete(*keys)


@pytest.fixture
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = ThrowawayRedis()
    server.start()
    yield server
    server.kill()
