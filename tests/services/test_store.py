"""``free_port``: ports for our services come from below the OS's ephemeral range, so a
port the OS hands out by itself never takes one between the check and the bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sloserve.services import store
from sloserve.services.store import PORT_FLOOR, ephemeral_low, free_port

LOW = ephemeral_low()
linux_range = pytest.mark.skipif(LOW <= PORT_FLOOR + 1000,
                                 reason="no ephemeral range to stay below on this host")


@linux_range
def test_free_ports_are_drawn_below_the_ephemeral_range_and_are_bindable() -> None:
    for _ in range(50):
        port = free_port()
        assert PORT_FLOOR <= port < LOW
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@linux_range
def test_a_port_the_os_hands_out_is_never_one_free_port_gives() -> None:
    # what a vLLM engine starting beside our services does: bind port 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] >= LOW
    assert all(free_port() < LOW for _ in range(50))


@linux_range
def test_without_a_readable_range_it_takes_the_os_pick(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "EPHEMERAL_RANGE", str(tmp_path / "missing"))
    assert ephemeral_low() == 0
    port = free_port()
    assert port >= LOW  # the OS's own pick, from its ephemeral range
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_embedded_store_wakes_a_blocked_reader_and_a_subscriber_promptly() -> None:
    """Issue 35: the embedded store polls its connections every ``EMBEDDED_POLL_S`` (not
    fakeredis's 10 ms) to idle cheaply; pushed replies still arrive within about that."""
    import threading
    import time

    import redis

    emb = store.EmbeddedRedis()
    try:
        reader, writer = redis.Redis.from_url(emb.url), redis.Redis.from_url(emb.url)
        sub = reader.pubsub()  # type: ignore[no-untyped-call]
        sub.subscribe("c")
        first = sub.get_message(timeout=2)
        assert first is not None and first["type"] == "subscribe"
        got: list[float] = []

        def block() -> None:
            if reader.xread({"s": "$"}, block=5000):
                got.append(time.monotonic())

        t = threading.Thread(target=block)
        t.start()
        time.sleep(0.3)  # blocked by now
        sent = time.monotonic()
        writer.xadd("s", {"k": "v"})
        t.join(timeout=6)
        assert got and got[0] - sent < 4 * store.EMBEDDED_POLL_S, got
        writer.publish("c", "x")
        msg = sub.get_message(timeout=4 * store.EMBEDDED_POLL_S)
        assert msg is not None and msg["data"] == b"x", msg
    finally:
        emb.close()
