"""``sloserve soak``: a live stack (sim backend) at a steady fraction of its capacity
for ``--duration`` seconds; reports errors, lost requests and RSS growth per process.

Not in CI (ten minutes by default). The rate is ``--load`` (default 0.8) times
``--capacity`` req/s, or times the simulator's goodput capacity of the same
deployment and trace (``sloserve capacity``, ``--estimate-requests`` requests per
probe) when no capacity is given. Requests are built as ``sloserve simulate``
builds them (trace lengths, Poisson arrivals) and every one sent before the end
of ``--duration`` is followed to its end.

* **lost**: sent, and neither completed with every token exactly once (indices
  0..n-1) nor refused with a status (RESOURCE_EXHAUSTED shed, INVALID_ARGUMENT);
  a stream that fails, hangs past its deadline or skips/duplicates a token is lost.
* **errors**: failed calls by status code (shed requests are counted apart).
* **restarts**: the stack runs under ``up``'s supervisor; every restart is listed
  (and fails the run, as does a lost request).
* **RSS** of each service process every ``--sample-every`` s (psutil when
  installed, else ``/proc/<pid>/status``); growth is reported from the first
  sample after the warm-up (``--warmup``, default 20% of the duration) to the last
  sample under load, and from the first sample of all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sloserve.deployment import Deployment
from sloserve.request import Request
from sloserve.services import deployment_flags
from sloserve.services.argtypes import redis_url

DEADLINE_S = 120.0  # per request, beyond its own generation time


def add_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="run the live stack at a fraction of capacity; "
                       "report lost requests and memory growth")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--load", type=float, default=0.8, help="fraction of capacity")
    p.add_argument("--capacity", type=float, default=None,
                   help="req/s (default: the simulator's goodput capacity estimate)")
    p.add_argument("--estimate-requests", type=int, default=300)
    deployment_flags.add_flags(p, ("policy", "instances", "model", "gpu", "seed"))
    p.add_argument("--trace", default="sharegpt")
    p.add_argument("--sample-every", type=float, default=5.0, help="RSS sampling period, s")
    p.add_argument("--warmup", type=float, default=None,
                   help="s before the RSS baseline (default 20%% of --duration)")
    p.add_argument("--redis-url", default=None, type=redis_url,
                   help="redis://, rediss:// or redis+sentinel://HOST:PORT[,HOST:PORT...]"
                   "/MASTER_NAME/DB; default $REDIS_URL, else embedded")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--out", default=None, help="write the JSON report here too")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (psutil if installed, else /proc)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is optional
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0
    return int(psutil.Process(pid).memory_info().rss)


def _estimate(args: argparse.Namespace) -> float:
    from sloserve.defaults import workload_slos
    from sloserve.sim.capacity import find_capacity
    from sloserve.sim.config import SimConfig

    ttft, tbt = workload_slos(None, None, None)
    cfg = SimConfig(policy=args.policy, model=args.model, gpu=args.gpu,
                    instances=args.instances, trace=args.trace, qps=1.0,
                    num_requests=args.estimate_requests, ttft_slo=ttft, tbt_slo=tbt,
                    seed=args.seed)
    cfg.validate()
    return float(find_capacity(cfg, "goodput", 0.9)["capacity_qps"])


def _workload(args: argparse.Namespace, qps: float) -> list[Request]:
    from sloserve.defaults import workload_slos
    from sloserve.perf.models import get_model
    from sloserve.sim.config import SimConfig
    from sloserve.sim.simulator import build_workload

    ttft, tbt = workload_slos(None, None, None)
    n = max(1, int(qps * args.duration * 1.3) + 10)
    cfg = SimConfig(policy=args.policy, model=args.model, gpu=args.gpu, trace=args.trace,
                    qps=qps, num_requests=n, ttft_slo=ttft, tbt_slo=tbt, seed=args.seed)
    cfg.validate()
    reqs = build_workload(cfg, get_model(args.model), None).requests  # type: ignore[arg-type]
    return [r for r in reqs if r.arrival_time < args.duration]


class Tally:
    def __init__(self) -> None:
        self.sent = self.completed = self.shed = self.invalid = self.lost = 0
        self.errors: dict[str, int] = {}
        self.lost_ids: list[str] = []
        self.ttft: list[float] = []

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


async def _one(client: Any, req: Request, t0: float, tally: Tally) -> None:
    from sloserve.services.bench_cmd import prompt_ids

    await asyncio.sleep(max(0.0, t0 + req.arrival_time - time.monotonic()))
    tally.sent += 1
    got: list[int] = []
    code = ""
    start = time.time()
    try:
        async for c in client.generate(
                prompt_token_ids=prompt_ids(req), max_tokens=req.output_len, ignore_eos=True,
                request_id=f"soak-{req.request_id}",
                timeout=DEADLINE_S + req.output_len * 0.5):
            if not got:
                tally.ttft.append(c.time - start)
            got.append(c.index)
    except Exception as exc:  # noqa: BLE001 - every failure is classified below
        code = getattr(getattr(exc, "code", None), "name", type(exc).__name__)
    if not code and got == list(range(req.output_len)):
        tally.completed += 1
        return
    if code == "RESOURCE_EXHAUSTED":
        tally.shed += 1
        return
    if code == "INVALID_ARGUMENT":
        tally.invalid += 1
        tally.error(code)
        return
    tally.lost += 1
    tally.error(code or "INCOMPLETE")
    if len(tally.lost_ids) < 20:
        tally.lost_ids.append(req.request_id)


class Sampler:
    """RSS of every service process every ``every`` s, in a thread."""

    def __init__(self, pids: dict[str, int], every: float) -> None:
        self.pids, self.every = pids, every
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while True:
            row: dict[str, int] = {}
            for name, pid in self.pids.items():
                try:
                    row[name] = rss_bytes(pid)
                except (OSError, ValueError):
                    row[name] = 0
                except Exception:  # noqa: BLE001 - psutil.NoSuchProcess and friends
                    row[name] = 0
            self.samples.append((time.monotonic() - self.t0, row))
            if self._stop.wait(self.every):
                return

    def start(self) -> Sampler:
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=10)


def _growth(samples: list[tuple[float, dict[str, int]]], warmup: float,
            end: float) -> dict[str, dict[str, float]]:
    under = [s for s in samples if s[0] <= end] or samples
    base = next((s for s in under if s[0] >= warmup), under[0])
    first, last = under[0], under[-1]
    out: dict[str, dict[str, float]] = {}
    for name in last[1]:
        b, f, x = base[1].get(name, 0), first[1].get(name, 0), last[1][name]
        peak = max(s[1].get(name, 0) for s in under)
        out[name] = {
            "rss_first_mb": round(f / 2**20, 1), "rss_baseline_mb": round(b / 2**20, 1),
            "rss_last_mb": round(x / 2**20, 1), "rss_peak_mb": round(peak / 2**20, 1),
            "growth_from_baseline_pct": round(100 * (x - b) / b, 2) if b else float("nan"),
            "growth_from_first_pct": round(100 * (x - f) / f, 2) if f else float("nan"),
        }
    return out


async def _drive(target: str, reqs: list[Request], tally: Tally) -> None:
    from sloserve.client import AsyncClient

    async with AsyncClient(target) as client:
        t0 = time.monotonic()
        await asyncio.gather(*(_one(client, r, t0, tally) for r in reqs))


def run(args: argparse.Namespace) -> int:
    from sloserve.services.stack import Stack, StackConfig
    from sloserve.services.store import free_port

    deployment_flags.resolve_into(args, Deployment())  # unset flags: the one defaults
    for flag, v in (("--duration", args.duration), ("--load", args.load),
                    ("--sample-every", args.sample_every)):
        if not v > 0:
            raise ValueError(f"{flag}: must be > 0, got {v}")
    if args.capacity is not None and not args.capacity > 0:
        raise ValueError(f"--capacity: must be > 0, got {args.capacity}")
    capacity = args.capacity if args.capacity is not None else _estimate(args)
    qps = args.load * capacity
    reqs = _workload(args, qps)
    warmup = args.warmup if args.warmup is not None else 0.2 * args.duration
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="soak-"))
    print(f"soak: {len(reqs)} requests at {qps:.2f} req/s ({args.load:.0%} of "
          f"{capacity:.2f}) for {args.duration:.0f} s; logs {log_dir}", file=sys.stderr,
          flush=True)
    stack = Stack(StackConfig(policy=args.policy, instances=args.instances, model=args.model,
                              gpu=args.gpu, gateway_port=free_port(), redis_url=args.redis_url,
                              seed=args.seed, log_dir=log_dir))
    tally = Tally()
    with stack:
        from sloserve.services.supervisor import Supervisor

        supervisor = Supervisor(stack).start()  # as under ``up``: a restart is reported
        pids = {n: s.proc.pid for n, s in stack.services.items() if s.proc is not None}
        sampler = Sampler(pids, args.sample_every).start()
        t0 = time.monotonic()
        asyncio.run(_drive(stack.gateway, reqs, tally))
        elapsed = time.monotonic() - t0
        time.sleep(min(args.sample_every, 5.0))  # one sample after the drain
        sampler.stop()
        supervisor.stop()
        exited = stack.exited()
    restarts = [{"service": r.service, "reason": r.reason, "recover_s": r.recover_s}
                for r in supervisor.restarts]
    ttft = sorted(tally.ttft)
    report: dict[str, Any] = {
        "command": "sloserve soak " + " ".join(sys.argv[2:]),
        "duration_s": args.duration, "elapsed_s": round(elapsed, 1), "load": args.load,
        "capacity_qps": round(capacity, 3), "capacity_given": args.capacity is not None,
        "qps": round(qps, 3), "policy": args.policy, "trace": args.trace,
        "sent": tally.sent, "completed": tally.completed, "shed": tally.shed,
        "lost": tally.lost, "errors": tally.errors, "lost_ids": tally.lost_ids,
        "ttft_p50_s": round(ttft[len(ttft) // 2], 4) if ttft else None,
        "ttft_p99_s": round(ttft[int(len(ttft) * 0.99)], 4) if ttft else None,
        "exited_services": exited, "restarts": restarts, "rss_backend": _rss_backend(),
        "warmup_s": warmup,
        "rss": _growth(sampler.samples, warmup, args.duration),
        "rss_after_drain_mb": {n: round(v / 2**20, 1)
                               for n, v in sampler.samples[-1][1].items()},
        "host_load_avg": os.getloadavg(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0 if tally.lost == 0 and not exited and not restarts else 1


def _rss_backend() -> str:
    try:
        import psutil  # noqa: F401
    except ImportError:  # pragma: no cover
        return "/proc"
    return "psutil"
