"""Frontend CPU per streamed token with ``--frontends 1`` and ``--frontends 2`` (issue 33).

Starts a sim stack (``Stack``, real Redis from ``$REDIS_URL``) per run, sends one burst of
``--requests`` streamed OpenAI completions over ``--connections`` connections
(``drills.openai_burst``: every stream checked exact), and reads utime + stime from
``/proc`` of every frontend process (``gateway``, ``gateway-1``, ...) and of the router
before and after it. Runs alternate (ABBA: 1, 2, 2, 1 frontends by default) and each
prints one JSON line with the 1-minute load average: frontend CPU µs per delivered token
(summed over frontends; also net of what they burn idle, measured for ``--idle-s`` before
the burst), the router's µs per request, each frontend's request count.

    PYTHONPATH=shared:services python infra/bench/frontends_cpu.py --order 1,2,2,1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from sloserve.services.drills.openai_burst import burst, expected_text
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid``, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scheduler_messages(stack: Stack) -> int:
    """Messages the schedulers have put on their streams (frontends' and router's)."""
    import grpc

    from sloserve.services.proto import scheduler_grpc, scheduler_pb2

    total = 0
    for name, svc in stack.services.items():
        if name.startswith("scheduler-"):
            with grpc.insecure_channel(svc.address) as ch:
                st = scheduler_grpc.SchedulerStub(ch).Status(
                    scheduler_pb2.StatusRequest(), metadata=stack.internal_metadata, timeout=10
                )
                total += st.output_seq
    return total


def served(stack: Stack, name: str) -> float:
    text = httpx.get(f"http://{stack.services[name].metrics}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def one_run(frontends: int, args: argparse.Namespace) -> dict[str, object]:
    cfg = StackConfig(
        policy=args.policy,
        instances=args.instances,
        frontends=frontends,
        stream_interval=args.stream_interval,
        gateway_port=free_port(),
        http_port=free_port(),
        metrics=True,
        redis_url=os.environ.get("REDIS_URL"),
        prefix=f"sloserve-bench:{uuid.uuid4().hex[:8]}",
        log_dir=Path(tempfile.mkdtemp(prefix="frontends-cpu-")),
    )
    with Stack(cfg) as stack:
        names = [n for n in stack.services if n.split("-")[0] == "gateway"]
        pids = {n: stack.services[n].proc.pid for n in names}  # type: ignore[union-attr]
        router = stack.services.get("router")
        router_pid = router.proc.pid if router is not None and router.proc else None
        idle0 = {n: cpu_s(p) for n, p in pids.items()}
        time.sleep(args.idle_s)  # what the frontends burn doing nothing (pollers, timers)
        before = {n: cpu_s(p) for n, p in pids.items()}
        idle_rate = sum(before[n] - idle0[n] for n in names) / max(args.idle_s, 1e-9)
        r0 = cpu_s(router_pid) if router_pid else 0.0
        m0 = scheduler_messages(stack)
        t0 = time.monotonic()
        out = asyncio.run(
            burst(
                stack.http,
                args.requests,
                args.max_tokens,
                args.connections,
                prefix=f"cpu{frontends}",
            )
        )
        wall = time.monotonic() - t0
        after = {n: cpu_s(p) for n, p in pids.items()}
        r1 = cpu_s(router_pid) if router_pid else 0.0
        messages = scheduler_messages(stack) - m0
        exact = sum(
            1 for rid, text in out.texts.items() if text == expected_text(rid, args.max_tokens)
        )
        counts = {n: served(stack, n) for n in names}
    tokens = sum(out.tokens.values())
    cpu = sum(after[n] - before[n] for n in names)
    return {
        "frontends": frontends,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "completed": len(out.texts),
        "exact": exact,
        "errors": len(out.errors),
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "frontend_cpu_s": round(cpu, 3),
        "frontend_us_per_token": round(1e6 * cpu / max(1, tokens), 1),
        "frontend_idle_cpu_per_s": round(idle_rate, 4),
        "frontend_us_per_token_above_idle": round(
            1e6 * (cpu - idle_rate * wall) / max(1, tokens), 1
        ),
        "scheduler_messages": messages,
        "per_frontend_cpu_s": {n: round(after[n] - before[n], 3) for n in names},
        "router_us_per_request": round(1e6 * (r1 - r0) / args.requests, 1) if router_pid else None,
        "requests_by_frontend": counts,
        "stream_interval": args.stream_interval,
        "load_1m": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--order", default="1,2,2,1", help="frontend counts, one run each")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--policy", default="sarathi")
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="the stack's --stream-interval (vLLM's stream_interval): the frontends' and the "
        "schedulers' (scheduler.coalesce)",
    )
    p.add_argument(
        "--idle-s",
        type=float,
        default=10.0,
        help="measure the frontends idle this long first (their baseline)",
    )
    args = p.parse_args()
    for n in (int(x) for x in args.order.split(",")):
        print(json.dumps(one_run(n, args)), flush=True)


if __name__ == "__main__":
    main()
