"""Start and stop a whole stack as OS processes (``sloserve up``, integration tests).

One process per service: perf-model, then per instance an executor and its
scheduler, then the gateway; each is ``python -m sloserve.services.<svc>``.
With no Redis URL an :class:`EmbeddedRedis` is started in this process.
Every Redis key lives under ``prefix``; every port but the gateway's is free
and loopback (``host`` is the gateway's alone).

Access (``services/sloserve/services/auth.py``): every child gets the stack's internal token in
``$SLOSERVE_INTERNAL_TOKEN`` (``internal_token``; by default ``$SLOSERVE_INTERNAL_TOKEN``
if set, else a fresh one per start), so only this stack's gateway can drive its
schedulers and only its schedulers their executors. The Redis URL (which may carry
a password) reaches the children in ``$REDIS_URL``, never on a command line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from sloserve.deployment import Deployment
from sloserve.policies import instance_roles
from sloserve.policies.flags import config_to_argv
from sloserve.services import admission_flags
from sloserve.services.auth import INTERNAL_TOKEN_ENV, internal_token, new_token
from sloserve.services.executor.backends import BACKENDS, TORCH, VLLM
from sloserve.services.rpc import PARENT_PID_ENV, wait_healthy
from sloserve.services.store import EmbeddedRedis, free_port, redis_url
from sloserve.services.tls import (
    INTERNAL_ENVS,
    TLS_CA_ENV,
    MutualTLS,
    ServerTLS,
    client_credentials,
)
from sloserve.tenancy import KeyLimits

# a vllm executor imports vLLM, loads the model and compiles it (as stock vllm serve: 100-200 s
# on a busy 2-core machine, vLLM 0.32's compile cache does not load here) before it answers
VLLM_START_S = 600.0
# a torch executor imports torch and loads (dequantizes) its weights before it answers:
# seconds on a quiet machine, past a minute on a busy one
TORCH_START_S = 180.0
LOG_TAIL_LINES = 20
INTERNAL_HOST = "127.0.0.1"  # every service but the gateway, whatever ``host`` says


DEFAULT_START_S = 60.0
PROGRESS_EVERY_S = 15.0  # a starting service's progress line, at least this often
# what a starting service is doing, read from its log (our executor's events and vLLM's
# own lines): the newest line that matches says it, the first pattern it matches wins
START_PHASES = (
    (re.compile(r'"event": "waiting_for_perf_model"'), "waiting for the perf model's first fit"),
    (re.compile(r'"event": "waiting_for_executor"'), "waiting for its executor"),
    (re.compile(r'"event": "warming_up"|init engine'), "warm-up sweep (perf-model samples)"),
    (re.compile(r"Warming up done"), "warming up"),
    (re.compile(r"Warming up model for the compilation|Starting torch\.compile|"
                r"Compiling a graph|Dynamo bytecode"), "compiling the model"),
    (re.compile(r'Starting to load model|Loading weights|"event": "loading"'),
     "loading the model"),
)


def start_phase(lines: list[str]) -> str | None:
    """What a starting service's log ``lines`` say it is doing (``None``: nothing known)."""
    for line in reversed(lines):
        for pattern, phase in START_PHASES:
            if pattern.search(line):
                return phase
    return None


def elapsed(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``."""
    m, s = divmod(int(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def start_budget(backend: str) -> float:
    """How long a service of a ``backend`` stack may take to report SERVING (its executor
    loads the model first; a scheduler waits for it, the gateway for the schedulers)."""
    return {VLLM: VLLM_START_S, TORCH: TORCH_START_S}.get(backend, DEFAULT_START_S)


@dataclass(frozen=True, slots=True)
class StackConfig(Deployment):
    """A ``Deployment`` (``sloserve.deployment``: policy, instances, model, GPU, KV, prefix
    caching, admission, overlap, refit clock, SLOs, noise) plus the processes that run it
    (issue 32, item 2). Every service is handed the resolved Deployment (``--deployment``)."""

    backend: str = "sim"
    weights: str | None = None
    host: str = "127.0.0.1"
    gateway_port: int = 50051
    redis_url: str | None = None  # None: $REDIS_URL, else embedded
    prefix: str = ""  # "": sloserve:<random>, whose keys are deleted on stop
    time_scale: float = 1.0
    dtype: str | None = None  # torch/vllm executors; None: the backend's default
    enforce_eager: bool = False  # vllm executors: eager model (default compiled, as vllm serve)
    log_dir: Path | None = None  # None: children inherit stderr
    # protocol tests (docs/architecture.md): the simulator's clock and timing, decision logs
    clock: str = "wall"  # "virtual": schedulers run the event clock, sim executors follow it
    fixed_batch_time: float | None = None  # sim executors: every batch takes this long
    decision_dir: Path | None = None  # gateway.jsonl + scheduler-<id>.jsonl decision logs
    coefficients_wait: float = 20.0  # schedulers wait this long for the first perf-model fit
    internal_token: str | None = None  # None: $SLOSERVE_INTERNAL_TOKEN, else generated
    internal_auth: bool = True  # False: the internal plane is open (nothing sent or checked)
    api_key_file: str | None = None  # the gateway's keys (also $SLOSERVE_API_KEYS)
    key_limits: KeyLimits = KeyLimits()  # the gateway's per-key limits (issue 36, item 7)
    http_port: int = 0  # the gateway's OpenAI-compatible HTTP API (0: off; `up`: 8000)
    tool_call_parser: str = ""  # the gateway's vLLM tool parser (tool_choice auto)
    # the gateway's and the schedulers' --stream-interval (vLLM's stream_interval)
    stream_interval: int = 1
    metrics: bool = False  # every service serves /metrics on a free port (`up`: on)
    log_level: str | None = None  # every service's; None: $SLOSERVE_LOG_LEVEL, else info
    # transport security (issue 34, ``tls.py``): the gateway's public certificate and key,
    # the CA that `up` checks the gateway's health with, the internal plane's mutual TLS
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None  # None: $SLOSERVE_TLS_CA
    tls_internal_dir: str | None = None  # ca.pem, <service>.pem, <service>-key.pem
    # frontend processes sharing the public ports (issue 33): 1 is the one gateway holding
    # the Controller; N > 1 are frontends "gateway", "gateway-1", ... and a "router" holding it
    frontends: int = 1

    def validate(self) -> None:
        self.check()
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: must be sim, torch or vllm, got {self.backend!r}")
        public = ServerTLS.from_args(self.tls_cert, self.tls_key)
        if public is not None and not (self.tls_ca or os.environ.get(TLS_CA_ENV)):
            raise ValueError(f"--tls-ca: required with --tls-cert (also ${TLS_CA_ENV}): the "
                             "CA that signed it, to check the gateway's health over TLS")
        if self.tls_internal_dir is not None:
            MutualTLS.from_dir(self.tls_internal_dir, "up", "gateway")
        if isinstance(self.frontends, bool) or not isinstance(self.frontends, int) \
                or self.frontends < 1:
            raise ValueError(f"--frontends: must be an integer >= 1, got {self.frontends!r}")
        if self.frontends > 1 and self.clock == "virtual":
            raise ValueError("--frontends: the virtual clock's conductor drives one gateway; "
                             "use --frontends 1 with --clock virtual")

    def resolved(self) -> Deployment:
        """The Deployment every service is handed: the policy's SLO-dependent defaults
        filled in as ``simulate`` fills them (the gateway's TBT SLO stands for the
        workload's)."""
        return replace(self.deployment(), policy_config=self.resolved_policy_config())


class StartFailed(RuntimeError):
    """A service exited (or never became healthy) while the stack was starting;
    ``tail`` holds the last lines of its log (empty without a ``log_dir``)."""

    def __init__(self, name: str, why: str, log: Path | None, tail: list[str]) -> None:
        where = f"; last {len(tail)} lines of {log}:" if tail else ""
        super().__init__(f"{name} {why} at start{where}")
        self.name, self.why, self.log, self.tail = name, why, log, tail


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``path`` ([] if it is missing)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


@dataclass(slots=True)
class Service:
    name: str
    argv: list[str]
    address: str
    health: str  # gRPC service name to wait for
    proc: subprocess.Popen[bytes] | None = None
    metrics: str = ""  # host:port of its /metrics, "" if none


class Stack:
    def __init__(self, cfg: StackConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self._ports: set[int] = set()  # ports handed to this stack's services
        self.prefix = cfg.prefix or f"sloserve:{uuid.uuid4().hex[:8]}"
        self.embedded: EmbeddedRedis | None = None
        self.redis_url = redis_url(cfg.redis_url) or ""
        self.services: dict[str, Service] = {}
        self.internal_token: str | None = None
        self._progress: Callable[[str], None] | None = None
        self._t0 = time.monotonic()
        if cfg.internal_auth:
            self.internal_token = cfg.internal_token or internal_token() or new_token()

    @property
    def internal_metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata that a test needs to talk to a scheduler, executor or perf-model."""
        from sloserve.services.auth import metadata

        return metadata(self.internal_token)

    @property
    def gateway(self) -> str:
        """The public gRPC address (every frontend's, with ``--frontends N``)."""
        return f"{self.cfg.host}:{self.cfg.gateway_port}"

    @property
    def http(self) -> str:
        """The OpenAI-compatible API's base URL ("" when off)."""
        scheme = "https" if self.cfg.tls_cert else "http"
        return f"{scheme}://{self.cfg.host}:{self.cfg.http_port}" if self.cfg.http_port else ""

    def internal_tls(self, name: str, *fallbacks: str) -> MutualTLS | None:
        """Service ``name``'s mutual-TLS files (``None``: the internal plane is plaintext):
        ``<name>.pem``, else ``<kind>.pem`` (``scheduler`` for ``scheduler-lp0``)."""
        d = self.cfg.tls_internal_dir
        if d is None:
            return None
        return MutualTLS.from_dir(d, *dict.fromkeys((name, name.split("-")[0], *fallbacks)))

    def credentials(self, name: str) -> grpc.ChannelCredentials | None:
        """What ``up`` (its start-up wait, the supervisor) checks service ``name``'s health
        with: the public CA for a TLS gateway, our own certificate on a mutual-TLS plane."""
        if name.split("-")[0] == "gateway":
            return client_credentials(self.cfg.tls_ca) if self.cfg.tls_cert else None
        mine = self.internal_tls("up", "gateway")
        return None if mine is None else mine.channel_credentials()

    def _module(self, svc: str, port: int, *args: str) -> list[str]:
        host = self.cfg.host if svc in ("gateway", "frontend") else INTERNAL_HOST
        base = [sys.executable, "-m", f"sloserve.services.{svc}", "--host", host,
                "--port", str(port)]
        return base + list(args)

    def _port(self, host: str) -> int:
        """A free port none of this stack's services was given yet (nor the gateway's
        or HTTP port): none is bound before the services start, so the OS may repeat one."""
        taken = {self.cfg.gateway_port, self.cfg.http_port, *self._ports}
        while (port := free_port(host)) in taken:
            pass
        self._ports.add(port)
        return port

    def plan(self) -> None:
        c, h = self.cfg, INTERNAL_HOST
        dep = c.resolved()
        # every service is handed the resolved Deployment; the flags beside it say the same
        # for a reader of `ps` and keep each service's own command line complete
        common = ["--prefix", self.prefix, "--deployment", dep.to_json()]  # Redis: $REDIS_URL
        p = self._port(h)
        refit = [] if c.refit_interval is None else ["--refit-interval", str(c.refit_interval)]
        self._add("perfmodel", self._module(
            "perfmodel", p, "--model", c.model, "--gpu", c.gpu, *refit, *common),
            f"{h}:{p}", "perfmodel")
        assert dep.policy_config is not None
        knobs = config_to_argv(dep.policy_config)
        # a vLLM executor answers Describe only once vLLM is imported and the model loaded
        budget = start_budget(c.backend)
        wait = ["--connect-timeout", str(budget)] if budget > DEFAULT_START_S else []
        scheds: list[str] = []
        for k, (iid, role) in enumerate(instance_roles(c.policy, c.instances, c.hp_instances)):
            pe, ps = self._port(h), self._port(h)
            ex = ["--backend", c.backend, "--model", c.model, "--gpu", c.gpu,
                  "--seed", str(c.seed), "--instance", str(k), "--noise-cv", str(c.noise_cv),
                  "--time-scale", str(c.time_scale), *common]
            if c.num_blocks:
                ex += ["--num-blocks", str(c.num_blocks)]
            if c.weights:
                ex += ["--weights", c.weights]
            if c.fixed_batch_time is not None:
                ex += ["--fixed-batch-time", str(c.fixed_batch_time)]
            ex += ["--clock", c.clock]
            if c.dtype:
                ex += ["--dtype", c.dtype]
            if c.enforce_eager:
                ex += ["--enforce-eager"]
            self._add(f"executor-{iid}", self._module("executor", pe, *ex), f"{h}:{pe}", "executor")
            self._add(f"scheduler-{iid}", self._module(
                "scheduler", ps, "--instance-id", iid, "--role", role, "--policy", c.policy,
                "--num-hp", str(c.hp_instances), *knobs, "--executor", f"{h}:{pe}",
                "--clock", c.clock, "--coefficients-wait", str(c.coefficients_wait),
                "--perf-model", c.perf_model, *wait,
                "--prefix-caching" if c.prefix_caching else "--no-prefix-caching",
                *(["--stream-interval", str(c.stream_interval)]
                  if c.stream_interval != 1 else []),
                *admission_flags.to_argv(c.admission),
                *self._decision_log(f"scheduler-{iid}"), *common), f"{h}:{ps}", "scheduler")
            scheds += ["--scheduler", f"{iid}={h}:{ps}"]
        gw = ["--ttft-slo", str(c.ttft_slo or 0), "--tbt-slo", str(c.tbt_slo or 0), *wait,
              "--clock", c.clock, "--deployment", dep.to_json()]
        if c.api_key_file:
            gw += ["--api-key-file", c.api_key_file]
        if c.http_port:
            gw += ["--http-port", str(c.http_port)]
        if c.tool_call_parser:
            gw += ["--tool-call-parser", c.tool_call_parser]
        if c.stream_interval != 1:
            gw += ["--stream-interval", str(c.stream_interval)]
        kl = c.key_limits
        if kl.on:
            gw += ["--max-inflight-per-key", str(kl.max_inflight), "--key-token-rate",
                   repr(kl.token_rate), "--key-token-burst", repr(kl.token_burst)]
        if c.tls_cert and c.tls_key:
            gw += ["--tls-cert", c.tls_cert, "--tls-key", c.tls_key]
        # the gateway (or the router of several frontends) learns the schedulers from the
        # registry in Redis, where each registers itself (issue 34, item 2); it serves once
        # all of this stack's are known, and follows joins and leaves from there
        registry = ["--prefix", self.prefix, "--min-instances", str(len(scheds) // 2)]
        if c.frontends == 1:
            self._add("gateway", self._module(
                "gateway", c.gateway_port, *gw, *registry, *self._decision_log("gateway")),
                f"{c.host}:{c.gateway_port}", "gateway")
            return
        self._plan_frontends(gw, registry, wait, dep.to_json())

    def _plan_frontends(self, gw: list[str], registry: list[str], wait: list[str],
                        deployment: str) -> None:
        """``--frontends N`` (issue 33): the router (the one Controller, following the
        registry; its decision log ``router.jsonl``) and N frontends on the public ports,
        which take the instances from the router; each also listens alone on a private
        port, which ``up`` checks its health on."""
        c, h = self.cfg, INTERNAL_HOST
        pr = self._port(h)
        self._add("router", self._module(
            "router", pr, *registry, *wait, "--deployment", deployment,
            *self._decision_log("router")), f"{h}:{pr}", "router")
        for k in range(c.frontends):
            own = self._port(c.host)
            name = "gateway" if k == 0 else f"gateway-{k}"
            self._add(name, self._module(
                "frontend", c.gateway_port, *gw, "--router", f"{h}:{pr}", "--index", str(k),
                "--private-port", str(own)), f"{c.host}:{own}", "gateway")

    def _decision_log(self, name: str) -> list[str]:
        d = self.cfg.decision_dir
        return [] if d is None else ["--decision-log", str(d / f"{name}.jsonl")]

    def _add(self, name: str, argv: list[str], address: str, health: str) -> None:
        from sloserve.services.proto import SERVICE_NAMES

        metrics = ""
        if self.cfg.metrics:  # served on the service's own --host (issue 36, item 6)
            host = address.rpartition(":")[0]
            port = self._port(host)
            argv = [*argv, "--metrics-port", str(port)]
            metrics = f"{host}:{port}"
        if self.cfg.log_level:
            argv = [*argv, "--log-level", self.cfg.log_level]
        self.services[name] = Service(name, argv, address, SERVICE_NAMES[health], metrics=metrics)

    def start(self, timeout: float = DEFAULT_START_S,
              progress: Callable[[str], None] | None = None) -> Stack:
        """Start every service; ``progress``: told what each is doing while it starts,
        with the time since the start (issue 35: a compiled vLLM start takes minutes)."""
        timeout = max(timeout, start_budget(self.cfg.backend))
        self._progress, self._t0 = progress, time.monotonic()
        if not self.redis_url:
            self.embedded = EmbeddedRedis()
            self.redis_url = self.embedded.url
        self.plan()
        try:
            # the gateway asks every scheduler for its Status as it starts, and a scheduler
            # is ready only once its executor is (a vllm executor loads for ~a minute)
            # the router (several frontends) reads the registry as the gateway does: after
            # the schedulers, whose entries may still name a crashed run's addresses
            public = [n for n in self.services if n.split("-")[0] == "gateway"]
            router = [n for n in self.services if n == "router"]
            backends = [n for n in self.services if n not in public and n not in router]
            for group in (backends, router, public):
                for name in group:
                    self.spawn(name)
                for name in group:
                    self._wait_started(name, time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_started(self, name: str, deadline: float) -> None:
        """Wait for ``name`` to be SERVING; its exit (or the deadline) raises
        :class:`StartFailed` with its log tail, without waiting out the rest."""
        svc = self.services[name]
        said, said_at = None, time.monotonic()
        while True:
            if svc.proc is not None and svc.proc.poll() is not None:
                raise self._failed(name, f"exited with code {svc.proc.returncode}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._failed(name, "was not healthy")
            try:
                wait_healthy(svc.address, svc.health, min(1.0, left), self.credentials(name))
                if self._progress is not None:
                    self._progress(f"started    {name} "
                                   f"({elapsed(time.monotonic() - self._t0)})")
                return
            except TimeoutError:
                pass
            if self._progress is None:
                continue
            log = self.cfg.log_dir / f"{name}.log" if self.cfg.log_dir is not None else None
            phase = start_phase(log_tail(log, 200)) if log is not None else None
            now = time.monotonic()
            if (phase is not None and phase != said) or now - said_at >= PROGRESS_EVERY_S:
                phase = phase or "starting"
                self._progress(f"starting   {name}: {phase} ({elapsed(now - self._t0)})")
                said, said_at = phase, now

    def _failed(self, name: str, why: str) -> StartFailed:
        log = self.cfg.log_dir / f"{name}.log" if self.cfg.log_dir is not None else None
        return StartFailed(name, why, log, log_tail(log) if log is not None else [])

    def spawn(self, name: str) -> None:
        svc = self.services[name]
        err = None
        if self.cfg.log_dir is not None:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
            err = open(self.cfg.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - child owns it
        # no preexec_fn: forking a process with live gRPC channels that way crashes the
        # child (grpc/grpc#43055); children watch PARENT_PID_ENV and exit when we die
        env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_PID_ENV: str(os.getpid()),
               "REDIS_URL": self.redis_url}
        env.pop(INTERNAL_TOKEN_ENV, None)
        if self.internal_token:
            env[INTERNAL_TOKEN_ENV] = self.internal_token
        for var in INTERNAL_ENVS:
            env.pop(var, None)
        # the router talks to the schedulers as the gateway did: the gateway's files serve it
        mtls = self.internal_tls(name, *(("gateway",) if name == "router" else ()))
        if mtls is not None:
            env.update(mtls.env())
        svc.proc = subprocess.Popen(svc.argv, stdout=err, stderr=err, env=env)
        if err is not None:
            err.close()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.services[name].proc
        assert proc is not None
        proc.send_signal(sig)
        proc.wait(timeout=10)

    def restart(self, name: str, timeout: float = 60.0) -> None:
        svc = self.services[name]
        if svc.proc is not None and svc.proc.poll() is None:
            self.kill(name, signal.SIGTERM)
        self.spawn(name)
        timeout = max(timeout, start_budget(self.cfg.backend))
        wait_healthy(svc.address, svc.health, timeout, self.credentials(name))

    def exited(self) -> list[str]:
        """Services whose process has ended."""
        return [n for n, s in self.services.items()
                if s.proc is not None and s.proc.poll() is not None]

    def stop(self, timeout: float = 5.0) -> None:
        # the gateway first: a scheduler stopped (deregistered) while a gateway still
        # follows the registry would have its requests moved to the others, themselves
        # stopping; with no gateway connected a scheduler's drain ends at once
        # (with several frontends: every frontend and the router, which follows the
        # registry; a frontend's clean stop leaves its requests for the next to adopt)
        procs = [s.proc for s in reversed(self.services.values()) if s.proc is not None]
        first = [s.proc for n, s in self.services.items() if s.proc is not None
                 and (n == "router" or n.split("-")[0] == "gateway")]
        for group in (first, [p for p in procs if p not in first]):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in group:
                try:
                    p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if self.embedded is not None:
            self.embedded.close()
            self.embedded = None
            self.redis_url = ""  # gone with it: a second stop() has no keys to forget
        elif not self.cfg.prefix and self.redis_url:
            self._forget_keys()  # a random prefix can never be resumed: leave Redis clean

    def _forget_keys(self) -> None:
        from sloserve.services.redisconn import sync_client

        r = sync_client(self.redis_url)
        keys = list(r.scan_iter(f"{self.prefix}:*", count=1000))
        for k in range(0, len(keys), 1000):
            r.delete(*keys[k:k + 1000])
        r.close()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
