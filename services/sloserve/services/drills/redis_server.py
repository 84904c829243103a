"""``redis-server``s of our own on free ports: one the Redis-outage drill kills, and a
master, replica and sentinels whose master the failover drill kills."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from sloserve.services.store import free_port


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


class SentinelRedis:
    """A master, one replica and ``n`` sentinels (``redis-server --sentinel``) of our own,
    on free loopback ports, their files in ``workdir`` (issue 34, item 3). Quick to fail
    over: a master silent for ``down_after_ms`` is down; a quorum of 2 promotes the
    replica. No persistence: the replica's copy is the only one."""

    def __init__(self, workdir: Path, master_name: str = "sloserve", n: int = 3,
                 down_after_ms: int = 1000, failover_timeout_ms: int = 5000) -> None:
        self.workdir = workdir
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.ports = [free_port() for _ in range(2)]  # the first master, its replica
        self.sentinel_ports = [free_port() for _ in range(n)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def _spawn(self, port: int, *argv: str) -> None:
        log = open(self.workdir / f"redis-{port}.log", "wb")  # noqa: SIM115 - the child's
        self.procs[port] = subprocess.Popen(["redis-server", *argv], stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.workdir)
        log.close()

    def start(self, timeout: float = 30.0) -> None:
        data = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--repl-diskless-sync-delay", "0"]
        master, replica = self.ports
        self._spawn(master, "--port", str(master), *data)
        self._spawn(replica, "--port", str(replica), *data,
                    "--replicaof", "127.0.0.1", str(master))
        for port in self.sentinel_ports:
            conf = self.workdir / f"sentinel-{port}.conf"  # the sentinel rewrites it
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {self.workdir}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {master} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {self.master_name} 1\n")
            self._spawn(port, str(conf), "--sentinel")
        deadline = time.monotonic() + timeout
        def synced() -> bool:
            with redis.Redis(port=replica, decode_responses=True) as r:
                info: Any = r.info("replication")
                return bool(info.get("master_link_status") == "up")
        self._wait(synced, deadline, "the replica's sync")
        for port in self.sentinel_ports:  # each sees the replica and the other sentinels
            def ready(port: int = port) -> bool:
                with redis.Redis(port=port, decode_responses=True) as r:
                    m: Any = r.sentinel_master(self.master_name)
                return bool(int(m["num-slaves"]) >= 1
                            and int(m["num-other-sentinels"]) >= len(self.sentinel_ports) - 1)
            self._wait(ready, deadline, f"sentinel {port}")
        for port, proc in self.procs.items():  # another process on a port we drew: say so
            if proc.poll() is not None:
                log = (self.workdir / f"redis-{port}.log").read_text(errors="replace")
                raise RuntimeError(f"redis-server on port {port} exited: {log[-500:]}")

    @staticmethod
    def _wait(ok: Callable[[], bool], deadline: float, what: str) -> None:
        while True:
            try:
                if ok():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not ready in time")
            time.sleep(0.05)

    def master(self) -> tuple[str, int]:
        """The master the sentinels name now."""
        for port in self.sentinel_ports:
            try:
                with redis.Redis(port=port) as r:
                    addr: Any = r.sentinel_get_master_addr_by_name(self.master_name)
                host, p = addr
                return str(host.decode() if isinstance(host, bytes) else host), int(p)
            except (redis.RedisError, TypeError):
                continue
        raise redis.ConnectionError("no sentinel names a master")

    def kill_master(self) -> int:
        """SIGKILL the current master; its port."""
        _, port = self.master()
        self.procs[port].kill()
        self.procs[port].wait(timeout=10)
        return port

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
