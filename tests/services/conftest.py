"""Live-stack fixtures: real service processes on fresh loopback ports, real Redis.

Every stack gets its own Redis key prefix and is torn down (processes and
keys) by the fixture's finalizer.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def start_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def start(**kw: object) -> Stack:
        cfg = StackConfig(
            gateway_port=free_port(), redis_url=REDIS_URL,
            prefix=f"sloserve-test:{uuid.uuid4().hex[:10]}",
            log_dir=tmp_path / f"logs{len(stacks)}", refit_interval=0.5, **kw,  # type: ignore[arg-type]
        )
        stack = Stack(cfg)
        stacks.append(stack)
        return stack.start()

    yield start
    r = redis.Redis.from_url(REDIS_URL)
    for s in stacks:
        s.stop()
        keys = list(r.scan_iter(f"{s.prefix}:*"))
        if keys:
            r.delete(*keys)
