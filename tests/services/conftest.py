"""Live-stack fixtures: real service processes on fresh loopback ports, real Redis.

Every stack gets its own Redis key prefix and is torn down (processes and
keys) by the fixture's finalizer.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis_source import redis_url

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


class ThrowawayRedis:
    """A ``redis-server`` of our own on a free port, without persistence, that a test
    may kill and start again (on the same port: clients reconnect to it)."""

    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no",
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, password=self.password)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = ThrowawayRedis()
    server.start()
    yield server
    server.kill()
