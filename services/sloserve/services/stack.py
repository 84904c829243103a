"""Start and stop a whole stack as OS processes (``sloserve up``, integration tests).

One process per service: perf-model, then per instance an executor and its
scheduler, then the gateway; each is ``python -m sloserve.services.<svc>``.
With no Redis URL an :class:`EmbeddedRedis` is started in this process.
Every Redis key lives under ``prefix``; every port but the gateway's is free
and loopback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sloserve.services.rpc import PARENT_PID_ENV, wait_healthy
from sloserve.services.store import EmbeddedRedis, free_port, redis_url

VLLM_START_S = 300.0


@dataclass(slots=True)
class StackConfig:
    policy: str = "sarathi"
    instances: int = 1
    hp_instances: int = 0
    backend: str = "sim"
    model: str = "llama-3-8b"
    gpu: str = "a100"
    weights: str | None = None
    host: str = "127.0.0.1"
    gateway_port: int = 50051
    redis_url: str | None = None  # None: $REDIS_URL, else embedded
    prefix: str = ""  # "": sloserve:<random>, whose keys are deleted on stop
    token_budget: int = 512
    max_num_seqs: dict[str, int] = field(default_factory=lambda: {"lp": 256, "hp": 256})
    offload_threshold: float = 1.0  # Ascendra LP; `sloserve up` sets 0 when there is no HP
    ttft_slo: float | None = 1.0  # gateway defaults
    tbt_slo: float | None = 0.15
    seed: int = 0
    noise_cv: float = 0.03
    time_scale: float = 1.0
    num_blocks: int | None = None
    dtype: str | None = None  # torch/vllm executors; None: the backend's default
    refit_interval: float = 1.0
    log_dir: Path | None = None  # None: children inherit stderr

    def validate(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances: must be >= 1, got {self.instances}")
        if not 0 <= self.hp_instances < self.instances:
            raise ValueError(f"hp_instances: must be in [0, instances), got {self.hp_instances}")
        if self.hp_instances and self.policy != "ascendra":
            raise ValueError("hp_instances: only the ascendra policy has HP instances")
        if self.backend not in ("sim", "torch", "vllm"):
            raise ValueError(f"backend: must be sim, torch or vllm, got {self.backend!r}")

    def policy_name(self, role: str) -> str:
        return f"ascendra-{role}" if self.policy == "ascendra" else self.policy


@dataclass(slots=True)
class Service:
    name: str
    argv: list[str]
    address: str
    health: str  # gRPC service name to wait for
    proc: subprocess.Popen[bytes] | None = None


class Stack:
    def __init__(self, cfg: StackConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.prefix = cfg.prefix or f"sloserve:{uuid.uuid4().hex[:8]}"
        self.embedded: EmbeddedRedis | None = None
        self.redis_url = redis_url(cfg.redis_url) or ""
        self.services: dict[str, Service] = {}

    @property
    def gateway(self) -> str:
        return self.services["gateway"].address

    def _module(self, svc: str, port: int, *args: str) -> list[str]:
        base = [sys.executable, "-m", f"sloserve.services.{svc}", "--host", self.cfg.host,
                "--port", str(port)]
        return base + list(args)

    def plan(self) -> None:
        c, h = self.cfg, self.cfg.host
        common = ["--redis-url", self.redis_url, "--prefix", self.prefix]
        p = free_port(h)
        self._add("perfmodel", self._module(
            "perfmodel", p, "--model", c.model, "--gpu", c.gpu,
            "--refit-interval", str(c.refit_interval), *common), f"{h}:{p}", "perfmodel")
        roles = ["lp"] * (c.instances - c.hp_instances) + ["hp"] * c.hp_instances
        scheds = []
        for k, role in enumerate(roles):
            iid = f"{role}{k}"
            pe, ps = free_port(h), free_port(h)
            ex = ["--backend", c.backend, "--model", c.model, "--gpu", c.gpu,
                  "--seed", str(c.seed + k), "--noise-cv", str(c.noise_cv),
                  "--time-scale", str(c.time_scale), *common]
            if c.num_blocks:
                ex += ["--num-blocks", str(c.num_blocks)]
            if c.weights:
                ex += ["--weights", c.weights]
            if c.dtype:
                ex += ["--dtype", c.dtype]
            self._add(f"executor-{iid}", self._module("executor", pe, *ex), f"{h}:{pe}", "executor")
            self._add(f"scheduler-{iid}", self._module(
                "scheduler", ps, "--instance-id", iid, "--role", role,
                "--policy", c.policy_name(role), "--token-budget", str(c.token_budget),
                "--max-num-seqs", str(c.max_num_seqs[role]),
                "--offload-threshold", str(c.offload_threshold), "--executor", f"{h}:{pe}",
                *common), f"{h}:{ps}", "scheduler")
            scheds += ["--scheduler", f"{iid}={h}:{ps}"]
        gw = ["--ttft-slo", str(c.ttft_slo or 0), "--tbt-slo", str(c.tbt_slo or 0), *scheds]
        self._add("gateway", self._module("gateway", c.gateway_port, *gw),
                  f"{h}:{c.gateway_port}", "gateway")

    def _add(self, name: str, argv: list[str], address: str, health: str) -> None:
        from sloserve.services.proto import SERVICE_NAMES

        self.services[name] = Service(name, argv, address, SERVICE_NAMES[health])

    def start(self, timeout: float = 60.0) -> Stack:
        if self.cfg.backend == "vllm":  # importing vLLM, maybe preparing the model: minutes
            timeout = max(timeout, VLLM_START_S)
        if not self.redis_url:
            self.embedded = EmbeddedRedis()
            self.redis_url = self.embedded.url
        self.plan()
        try:
            # the gateway asks every scheduler for its Status as it starts, and a scheduler
            # is ready only once its executor is (a vllm executor loads for ~a minute)
            *backends, gateway = self.services
            for name in backends:
                self.spawn(name)
            for name in backends:
                wait_healthy(self.services[name].address, self.services[name].health, timeout)
            self.spawn(gateway)
            wait_healthy(self.services[gateway].address, self.services[gateway].health, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self, name: str) -> None:
        svc = self.services[name]
        err = None
        if self.cfg.log_dir is not None:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
            err = open(self.cfg.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - child owns it
        # no preexec_fn: forking a process with live gRPC channels that way crashes the
        # child (grpc/grpc#43055); children watch PARENT_PID_ENV and exit when we die
        env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_PID_ENV: str(os.getpid())}
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
        if self.cfg.backend == "vllm":
            timeout = max(timeout, VLLM_START_S)
        wait_healthy(svc.address, svc.health, timeout)

    def exited(self) -> list[str]:
        """Services whose process has ended."""
        return [n for n, s in self.services.items()
                if s.proc is not None and s.proc.poll() is not None]

    def stop(self, timeout: float = 5.0) -> None:
        procs = [s.proc for s in reversed(self.services.values()) if s.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.embedded is not None:
            self.embedded.close()
            self.embedded = None
        elif not self.cfg.prefix and self.redis_url:
            self._forget_keys()  # a random prefix can never be resumed: leave Redis clean

    def _forget_keys(self) -> None:
        import redis

        r = redis.Redis.from_url(self.redis_url)
        keys = list(r.scan_iter(f"{self.prefix}:*", count=1000))
        for k in range(0, len(keys), 1000):
            r.delete(*keys[k:k + 1000])
        r.close()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
