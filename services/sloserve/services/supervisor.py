"""The supervisor of ``sloserve up``: restarts a dead or unhealthy service, alone.

One watcher thread per service, so a restart (which may wait a minute for a vLLM
executor to load) never delays another's. Every ``interval`` a watcher checks its
service: the process must be alive and its gRPC health service must answer
SERVING (every ``healthy_interval`` while it does). A healthy service is checked on
one kept channel (issue 35: a fresh channel per check every 0.5 s cost ``up`` ~4 % of a
core idle); a failed check, or a restart, closes it, so the next check connects afresh
(a channel kept across a restart may sit in gRPC's reconnect backoff and report the
old failure long after the new process is up).
The check asks for the server's own status (``""``: liveness), not the service's
(readiness): a scheduler whose executor hangs turns its service NOT_SERVING so the
gateway routes around it, but it is healthy and must not be restarted with its
executor (issue 36, item 4); the executor's own watcher replaces the hung executor.

* process exited → restarted at once;
* alive but not SERVING (hung, SIGSTOPped, draining for ever) for
  ``unhealthy_s`` → SIGKILLed and restarted (as a Kubernetes liveness probe);
* a (re)started service gets ``start_s`` to report SERVING before it counts as
  unhealthy;
* consecutive restarts of one service back off exponentially (``backoff_base_s``
  doubling to ``backoff_cap_s``); a service SERVING for ``stable_s`` starts over.

The other services keep running (their PIDs do not change): the gateway's
scheduler links and the schedulers' executor links reconnect by themselves.
Nothing here ever stops the stack: only the caller does (SIGINT/SIGTERM in ``up``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sloserve.services.rpc import health_channel
from sloserve.services.stack import Stack

CHECK_TIMEOUT_S = 1.0
LIVENESS = ""  # the server's own health status: alive, whatever its readiness


class HealthCheck:
    """One service's health checks, on a channel kept while it answers SERVING; a failed
    check (or :meth:`reset`, after a restart) closes it, so the next connects afresh."""

    def __init__(self, address: str, service: str,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.address, self.service, self.credentials = address, service, credentials
        self._channel: grpc.Channel | None = None
        self._stub: health_pb2_grpc.HealthStub | None = None
        self.channels_opened = 0  # channels it has connected (tests, evidence)
        self.calls = 0  # checks made

    def __call__(self, timeout: float = CHECK_TIMEOUT_S) -> bool:
        """SERVING within ``timeout``."""
        self.calls += 1
        if self._stub is None:
            self._channel = health_channel(self.address, self.credentials)
            self._stub = health_pb2_grpc.HealthStub(self._channel)
            self.channels_opened += 1
        try:
            resp = self._stub.Check(health_pb2.HealthCheckRequest(service=self.service),
                                    timeout=timeout)
            ok = bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
        except grpc.RpcError:
            ok = False
        if not ok:
            self.reset()
        return ok

    def reset(self) -> None:
        """Close the kept channel (the next check opens a fresh one)."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None


@dataclass(slots=True)
class Restart:
    """One recovery: why, when the failure was seen, when the service was SERVING again."""

    service: str
    reason: str  # "exited (code N)" or "unhealthy for N s"
    attempt: int  # consecutive restarts of this service, 1 = first
    detected_at: float  # time.time()
    spawned_at: float = 0.0
    serving_at: float | None = None  # None: not (yet) SERVING again
    pid: int = 0

    @property
    def recover_s(self) -> float | None:
        return None if self.serving_at is None else self.serving_at - self.detected_at


@dataclass(slots=True)
class Policy:
    interval: float = 0.5  # the process is polled this often (a dead one is seen at once)
    # a SERVING service's health is checked this often; a failing or starting one's every
    # ``interval`` (issue 35: ``up`` idles at <= 0.5 % of a core)
    healthy_interval: float = 2.0
    unhealthy_s: float = 5.0
    start_s: float = 60.0
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    stable_s: float = 60.0


@dataclass(slots=True)
class _Watch:
    name: str
    attempts: int = 0  # consecutive restarts
    failing_since: float | None = None  # monotonic: first failed check of this run
    started: float = field(default_factory=time.monotonic)
    serving_since: float | None = None
    pending: Restart | None = None  # waiting for SERVING
    checked: float = 0.0  # monotonic: the last health check


class Supervisor:
    """Watches every service of a started :class:`Stack` until :meth:`stop`."""

    def __init__(self, stack: Stack, policy: Policy | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.stack, self.policy = stack, policy or Policy()
        self.say = say or (lambda line: print(line, flush=True))
        self.restarts: list[Restart] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.checks = {name: HealthCheck(svc.address, LIVENESS, stack.credentials(name))
                       for name, svc in stack.services.items()}
        self._threads = [threading.Thread(target=self._watch, args=(name,),
                                          name=f"supervise-{name}", daemon=True)
                         for name in stack.services]

    def start(self) -> Supervisor:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _log(self, msg: str) -> None:
        with self._lock:
            self.say(f"supervisor: {msg}")

    def _watch(self, name: str) -> None:
        p, w = self.policy, _Watch(name)
        svc = self.stack.services[name]
        check = self.checks[name]
        while not self._stop.wait(p.interval):
            proc = svc.proc
            now = time.monotonic()
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                check.reset()
                self._restart(w, f"exited (code {code})")
                continue
            if w.serving_since is not None and now - w.checked < p.healthy_interval - 1e-3:
                continue  # SERVING at the last check: only the process is polled this time
            w.checked = now
            if check():
                w.failing_since = None
                if w.serving_since is None:
                    w.serving_since = now
                if w.pending is not None:
                    w.pending.serving_at = time.time()
                    self._log(f"{name} SERVING again (pid {proc.pid}) "
                              f"{w.pending.recover_s:.2f} s after the failure was seen")
                    w.pending = None
                if now - w.serving_since >= p.stable_s:
                    w.attempts = 0
                continue
            w.serving_since = None
            if w.pending is not None and now - w.started < p.start_s:
                continue  # still starting
            if w.failing_since is None:
                w.failing_since = now
            elif now - w.failing_since >= p.unhealthy_s:
                check.reset()
                self._restart(w, f"unhealthy for {now - w.failing_since:.1f} s")
        check.reset()

    def _restart(self, w: _Watch, reason: str) -> None:
        p = self.policy
        w.attempts += 1
        r = Restart(w.name, reason, w.attempts, time.time())
        delay = 0.0 if w.attempts == 1 else min(
            p.backoff_cap_s, p.backoff_base_s * 2 ** (w.attempts - 2))
        self._log(f"{w.name} {reason}; restarting (attempt {w.attempts}"
                  f"{f', in {delay:.1f} s' if delay else ''})")
        if delay and self._stop.wait(delay):
            return
        svc = self.stack.services[w.name]
        if svc.proc is not None and svc.proc.poll() is None:
            svc.proc.send_signal(signal.SIGKILL)  # hung: SIGTERM may never be handled
            svc.proc.wait(timeout=10)
        self.stack.spawn(w.name)
        assert svc.proc is not None
        r.spawned_at, r.pid = time.time(), svc.proc.pid
        with self._lock:
            self.restarts.append(r)
        w.pending, w.started = r, time.monotonic()
        w.failing_since = w.serving_since = None
