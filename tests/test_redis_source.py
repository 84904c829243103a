"""How a test session picks its Redis (``tests/redis_source.py``): ``$REDIS_URL``, else a
testcontainers Redis when Docker answers, else the local one, quickly and never by
pulling an image."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis_source


@pytest.fixture
def no_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)


def test_the_session_publishes_one_redis_url_that_answers() -> None:
    url = os.environ["REDIS_URL"]  # set by tests/conftest.py before any test module
    assert redis_source.redis_url() == url
    assert redis.Redis.from_url(url, socket_timeout=5).ping()


def test_a_set_redis_url_is_used_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://example.invalid:1/3")
    choice = redis_source.choose()
    assert (choice.url, choice.source, choice.container) == (
        "redis://example.invalid:1/3", "env", None)


def test_no_docker_socket_falls_back_to_the_local_redis_at_once(
    no_redis_url: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/absent.sock")
    t0 = time.monotonic()
    choice = redis_source.choose()
    assert time.monotonic() - t0 < 0.5
    assert (choice.url, choice.source) == (redis_source.LOCAL_REDIS_URL, "local")
    assert "no Docker socket" in choice.why


@pytest.fixture
def silent_socket(tmp_path: Path) -> Iterator[Path]:
    """A unix socket that accepts connections and never answers (a hung engine)."""
    path = tmp_path / "silent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield path
    stop.set()
    t.join(timeout=2)
    for c in held:
        c.close()
    server.close()


def test_a_docker_engine_that_does_not_answer_falls_back_within_the_probe_timeout(
    no_redis_url: None, monkeypatch: pytest.MonkeyPatch, silent_socket: Path,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{silent_socket}")
    t0 = time.monotonic()
    choice = redis_source.choose()
    elapsed = time.monotonic() - t0
    assert (choice.url, choice.source) == (redis_source.LOCAL_REDIS_URL, "local")
    assert "Docker did not answer" in choice.why
    assert elapsed < 3 * redis_source.PROBE_TIMEOUT_S + 1  # bounded: never a hang


def _docker() -> object:
    client, why = redis_source.docker_client()
    if client is None:
        pytest.skip(f"no Docker engine: {why}")
    return client


def test_with_docker_a_container_redis_answers_and_is_removed_on_close(
    no_redis_url: None,
) -> None:
    client = _docker()
    choice = redis_source.choose()
    if choice.source != "testcontainers":
        pytest.skip(f"no local Redis image: {choice.why}")
    cid = choice.container.get_container_id()
    assert redis.Redis.from_url(choice.url, socket_timeout=5).ping()
    assert choice.url != redis_source.LOCAL_REDIS_URL
    choice.close()
    ids = [c.id for c in client.containers.list(all=True)]  # type: ignore[attr-defined]
    assert cid not in ids


def test_with_docker_a_missing_image_falls_back_without_pulling(no_redis_url: None) -> None:
    client = _docker()
    tag = "sloserve-no-such-redis:0"
    before = {i.id for i in client.images.list()}  # type: ignore[attr-defined]
    choice = redis_source.choose(images=(tag,))
    assert (choice.url, choice.source) == (redis_source.LOCAL_REDIS_URL, "local")
    assert f"no local image {tag}" in choice.why
    assert {i.id for i in client.images.list()} == before  # type: ignore[attr-defined]
