"""A service refuses a port another process listens on (no SO_REUSEPORT sharing): it
exits non-zero with one line naming the port, and the first one keeps serving."""

from __future__ import annotations

import os
import subprocess
import sys

from redis_source import redis_url

from sloserve.services.proto import SERVICE_NAMES
from sloserve.services.rpc import PARENT_PID_ENV, wait_healthy
from sloserve.services.store import free_port

REDIS_URL = redis_url()  # the session's one Redis (tests/redis_source.py)


def _perfmodel(port: int) -> list[str]:
    return [sys.executable, "-m", "sloserve.services.perfmodel", "--port", str(port),
            "--redis-url", REDIS_URL, "--prefix", f"sloserve-test:port{port}"]


def test_second_service_on_a_port_in_use_exits_with_one_line_naming_the_port() -> None:
    port = free_port()
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
    first = subprocess.Popen(_perfmodel(port), stderr=subprocess.DEVNULL, env=env)
    try:
        wait_healthy(f"127.0.0.1:{port}", SERVICE_NAMES["perfmodel"], timeout=30)
        second = subprocess.run(_perfmodel(port), capture_output=True, text=True, timeout=60,
                                env=env)
        assert second.returncode == 2
        errors = [ln for ln in second.stderr.splitlines() if "error" in ln.lower()]
        assert errors == [f"python -m sloserve.services.perfmodel: error: port {port}: "
                          f"cannot listen on 127.0.0.1:{port}, already in use"], second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None
        wait_healthy(f"127.0.0.1:{port}", SERVICE_NAMES["perfmodel"], timeout=5)
    finally:
        first.terminate()
        first.wait(timeout=10)
