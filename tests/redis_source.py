"""The one Redis a test session uses, chosen once (``tests/conftest.py``) and published
in ``$REDIS_URL`` for every test and every service process a test starts.

In order: ``$REDIS_URL`` when it is set; else, when a Docker engine answers, one
``redis:7-alpine`` (or ``redis:7``) container for the whole session, started with
testcontainers (the design's tool for test dependencies); else the local
``redis://127.0.0.1:6379/0``. No image registry is reachable from our machines, so an
image is used only if it is already local (``/work/shared/tools/container-engine``
builds both tags); a missing image or a Docker that does not answer within
``PROBE_TIMEOUT_S`` falls back to the local Redis, never a pull or a hang.

Test modules read the choice with :func:`redis_url`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
IMAGES = ("redis:7-alpine", "redis:7")
PROBE_TIMEOUT_S = 2.0
#: the label that marks our containers, valued with the pid of the session that owns one
LABEL = "sloserve.tests.session-pid"


def redis_url() -> str:
    """The session's Redis URL (``tests/conftest.py`` sets ``$REDIS_URL`` before any test
    module is imported)."""
    return os.environ.get("REDIS_URL", LOCAL_REDIS_URL)


@dataclass
class RedisChoice:
    url: str
    source: str  # "env", "testcontainers" or "local"
    why: str  # one line for the session header
    container: Any = None  # testcontainers' RedisContainer, stopped by close()

    def close(self) -> None:
        if self.container is not None:
            with contextlib.suppress(Exception):
                self.container.stop()
            self.container = None


def _docker_socket_present() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return os.path.exists(host.removeprefix("unix://"))
    if host:
        return True  # tcp/ssh: only a ping can say
    return os.path.exists("/var/run/docker.sock")


def docker_client(timeout_s: float = PROBE_TIMEOUT_S) -> tuple[Any, str]:
    """A docker SDK client whose engine answered a ping within ``timeout_s``, or
    ``(None, why not)``. Fast when there is no socket (no connection is attempted)."""
    if not _docker_socket_present():
        return None, "no Docker socket"
    try:
        import docker
    except ImportError:
        return None, "the docker SDK is not installed (pip install 'testcontainers[redis]')"
    try:
        client = docker.from_env(timeout=int(max(1, timeout_s)))
        client.ping()
    except Exception as exc:  # an engine that is down, slow or refuses us: all "absent"
        return None, f"Docker did not answer ({type(exc).__name__})"
    return client, ""


def _reap_orphans(client: Any) -> None:
    """Remove containers left by sessions that died without their teardown (no Ryuk:
    its image cannot be pulled here)."""
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        pid = int(c.labels.get(LABEL, "0") or 0)
        alive = pid > 0
        if alive:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                alive = False
            except PermissionError:
                pass
        if not alive:
            with contextlib.suppress(Exception):
                c.remove(force=True)


def start_container(client: Any, images: tuple[str, ...] = IMAGES) -> tuple[Any, str]:
    """One Redis container from the first of ``images`` that is local (never pulled),
    and its URL; or ``(None, why not)``."""
    import docker.errors

    image = None
    for tag in images:
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            continue
        image = tag
        break
    if image is None:
        return None, (f"no local image {' or '.join(images)} (no registry here: "
                      "/work/shared/tools/container-engine builds them)")
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # Ryuk's image: a pull
    try:
        from testcontainers.community.redis import RedisContainer
        from testcontainers.core.config import testcontainers_config
    except ImportError:
        return None, "testcontainers is not installed (pip install 'testcontainers[redis]')"
    testcontainers_config.ryuk_disabled = True
    with contextlib.suppress(Exception):
        _reap_orphans(client)
    container = RedisContainer(image).with_kwargs(labels={LABEL: str(os.getpid())})
    try:
        container.start()
        host = container.get_container_host_ip()
        port = container.get_exposed_port(container.port)
    except Exception as exc:
        with contextlib.suppress(Exception):
            container.stop()
        return None, f"the {image} container did not start ({type(exc).__name__}: {exc})"
    return container, f"redis://{host}:{port}/0"


def choose(images: tuple[str, ...] = IMAGES) -> RedisChoice:
    """Pick the session's Redis (see the module docstring)."""
    if os.environ.get("REDIS_URL"):
        return RedisChoice(os.environ["REDIS_URL"], "env", "from $REDIS_URL")
    t0 = time.monotonic()
    client, why = docker_client()
    if client is not None:
        container, out = start_container(client, images)
        with contextlib.suppress(Exception):
            client.close()
        if container is not None:
            return RedisChoice(out, "testcontainers",
                               f"a {container.image} container (testcontainers, "
                               f"{time.monotonic() - t0:.1f} s to start)", container)
        why = out
    return RedisChoice(LOCAL_REDIS_URL, "local", f"the local Redis ({why})")
