"""Redis: the one place state outlives a process (docs/design.md, storage).

``REDIS_URL`` names a real Redis. With none configured, ``sloserve up`` starts
an :class:`EmbeddedRedis`: fakeredis's TCP server on a loopback port, so every
service process still talks the Redis protocol through the same ``redis``
client. Every key of one stack lives under its ``prefix`` (:class:`Keys`).
"""

from __future__ import annotations

import os
import random
import socket
import threading
from dataclasses import dataclass

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# fakeredis's TCP server polls each client connection this often for replies it pushes
# (pub/sub messages, a blocking XREAD's wake-up); its own 10 ms cost an idle ``up`` ~1.3 %
# of a core (issue 35). The stack's pushed replies (coefficient updates, perf-model
# samples) are not latency-bound: 0.1 s late is harmless; commands are answered at once.
EMBEDDED_POLL_S = 0.1


def redis_url(explicit: str | None = None) -> str | None:
    """The configured Redis: ``explicit``, else ``$REDIS_URL``, else ``None`` (embed one)."""
    return explicit or os.environ.get("REDIS_URL") or None


PORT_FLOOR = 20000  # free_port draws from here up to the OS's ephemeral range
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_low() -> int:
    """The lowest port the OS hands out on its own (Linux; 0 where it cannot be read)."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for a service about to bind it. Drawn at random below
    the OS's ephemeral range where there is room (Linux: 20000 up to 32768), so no port
    the OS hands out by itself — another process's bind to port 0 (a vLLM engine starting
    beside our services does that), any outgoing connection's local end — can take it
    between this check and the service's own bind. Else the OS's pick (port 0)."""
    low = ephemeral_low()
    if low > PORT_FLOOR + 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(PORT_FLOOR, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A Redis-protocol server on ``127.0.0.1:port`` backed by fakeredis, in a thread."""

    def __init__(self, port: int | None = None) -> None:
        from fakeredis import TcpFakeServer
        from fakeredis._clients import _tcp_server

        if hasattr(_tcp_server, "_POLL_INTERVAL"):  # private: absent in another version
            _tcp_server._POLL_INTERVAL = EMBEDDED_POLL_S
        self.port = port or free_port()
        self._server = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="embedded-redis", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@dataclass(frozen=True, slots=True)
class Keys:
    """Key layout of one stack (``prefix`` namespaces it, e.g. ``sloserve:ab12cd``)."""

    prefix: str

    def request(self, instance_id: str, request_id: str) -> str:  # RequestSpec (protobuf)
        return f"{self.prefix}:inst:{instance_id}:req:{request_id}"

    def tokens(self, instance_id: str, request_id: str) -> str:  # list: generated token ids
        return f"{self.prefix}:inst:{instance_id}:tok:{request_id}"

    def queue(self, instance_id: str) -> str:  # zset: accepted, unfinished ids by arrival
        return f"{self.prefix}:inst:{instance_id}:queue"

    def instance(self, instance_id: str) -> str:  # hash: registry entry + heartbeat
        return f"{self.prefix}:inst:{instance_id}"

    @property
    def samples(self) -> str:  # stream: executed batches (perf-model training data)
        return f"{self.prefix}:samples"

    @property
    def clock(self) -> str:  # virtual clock: the horizon (float) + pub/sub channel
        return f"{self.prefix}:clock"

    @property
    def clock_held(self) -> str:  # hash: executor -> end of the batch it holds ("" = none)
        return f"{self.prefix}:clock:held"

    @property
    def coefficients(self) -> str:  # string (JSON) + pub/sub channel of the same name
        return f"{self.prefix}:coefficients"
