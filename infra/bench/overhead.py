"""Per-iteration service overhead with ~1,000 waiting requests (sloserve live stack).

Starts a one-instance stack (sim backend, real Redis or embedded), keeps
``--requests`` long requests in flight so the waiting queue stays near 1,000,
and reads the scheduler's ``Status``: overhead = wall time of an iteration not
spent executing the batch (policy decision + plan/result stream hops +
applying the result), p50/p99 over the last iterations.

By default the requests go through the gateway with the SDK (1,000+ client
streams in this process); ``--direct`` makes this script the gateway (it
speaks the scheduler's Connect stream itself), which leaves the CPU to the
scheduler and executor on a small machine.

    python infra/bench/overhead.py --policy sarathi --requests 1100 [--direct]

``unhidden_*`` is the time the executor sat idle between two consecutive
batches (it reports each gap itself): with overlap scheduling (the scheduler's
default, ``--no-overlap`` here turns it off) the decision and the stream hops
run while a batch executes, so only this part is left on the critical path.

``--out FILE`` saves the window's un-hidden gaps as the simulator's overhead
profile (``sloserve.sim.overhead``; ``{backend}`` in FILE names one per backend).

``--backends sim,vllm`` measures the same on each backend, one stack after the
other in this run (``vllm``: vLLM's engine on SmolLM2-135M, CPU; its
iterations are real forward passes, so they are fewer per second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from sloserve.client import AsyncClient, SloserveError
from sloserve.services.proto import common_pb2, scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack, StackConfig
from sloserve.services.store import free_port
from sloserve.sim.overhead import OverheadProfile


async def _hold(client: AsyncClient, k: int, prompt_len: int, max_tokens: int) -> None:
    try:
        async for _ in client.generate(prompt_token_ids=[97 + k % 26] * prompt_len,
                                       max_tokens=max_tokens, ttft_slo=3600, tbt_slo=3600):
            pass
    except (SloserveError, asyncio.CancelledError):
        pass


async def _as_gateway(
    target: str, args: argparse.Namespace, md: tuple[tuple[str, str], ...]
) -> None:
    """Be the gateway: Hello, then every request, then read (and drop) the outputs."""
    q: asyncio.Queue[scheduler_pb2.SchedulerInput] = asyncio.Queue()
    q.put_nowait(scheduler_pb2.SchedulerInput(hello=scheduler_pb2.Hello(gateway_id="bench")))
    now = time.time()
    for k in range(args.requests):
        q.put_nowait(scheduler_pb2.SchedulerInput(submit=common_pb2.RequestSpec(
            request_id=f"r{k}", prompt_token_ids=[97 + k % 26] * args.prompt_len,
            max_tokens=args.max_tokens, ttft_slo=3600, tbt_slo=3600, arrival_time=now)))

    async def inputs() -> AsyncIterator[scheduler_pb2.SchedulerInput]:
        while True:
            yield await q.get()

    async with grpc.aio.insecure_channel(target) as ch:
        async for _ in scheduler_grpc.SchedulerStub(ch).Connect(inputs(), metadata=md):
            pass


async def measure(stack: Stack, args: argparse.Namespace) -> dict[str, float]:
    addr = stack.services["scheduler-lp0"].address
    status = scheduler_grpc.SchedulerStub(grpc.aio.insecure_channel(addr)).Status
    md = stack.internal_metadata  # the internal plane's token (services/auth.py)
    async with AsyncClient(stack.gateway) as client:
        if args.direct:
            stack.kill("gateway")
            tasks = [asyncio.create_task(_as_gateway(addr, args, md))]
        else:
            tasks = [asyncio.create_task(_hold(client, k, args.prompt_len, args.max_tokens))
                     for k in range(args.requests)]
        await asyncio.sleep(args.warmup)
        first = await status(scheduler_pb2.StatusRequest(), metadata=md)
        await asyncio.sleep(args.seconds)
        st = await status(scheduler_pb2.StatusRequest(), metadata=md)
        for t in tasks:
            t.cancel()
    if args.out:  # the window's gaps as the simulator's overhead profile (sim.overhead)
        full = await status(scheduler_pb2.StatusRequest(samples=True), metadata=md)
        OverheadProfile(tuple(full.unhidden_samples_s), backend=stack.cfg.backend,
                        policy=args.policy, overlap=full.overlap, source={
                            "command": "infra/bench/overhead.py", "requests": args.requests,
                            "direct": args.direct, "time_scale": args.time_scale,
                            "load_avg_1m": os.getloadavg()[0]},
                        ).save(args.out.replace("{backend}", stack.cfg.backend))
    return {"mode": "direct" if args.direct else "sdk+gateway",
        "backend": stack.cfg.backend, "policy": args.policy, "requests": args.requests,
        "waiting": st.num_waiting,
        "running": st.num_running, "iterations": st.iterations - first.iterations,
        "overhead_p50_ms": st.overhead_p50_s * 1e3, "overhead_p99_ms": st.overhead_p99_s * 1e3,
        "schedule_p50_ms": st.schedule_p50_s * 1e3, "schedule_p99_ms": st.schedule_p99_s * 1e3,
        "overlap": st.overlap,
        "unhidden_p50_ms": st.unhidden_p50_s * 1e3, "unhidden_p99_ms": st.unhidden_p99_s * 1e3,
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="sarathi")
    p.add_argument("--requests", type=int, default=1100)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--num-blocks", type=int, default=4000)
    p.add_argument("--time-scale", type=float, default=0.5, help="shrink sim batch times")
    p.add_argument("--warmup", type=float, default=8.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--redis-url", default=None)
    p.add_argument("--direct", action="store_true", help="be the gateway (no SDK streams)")
    p.add_argument("--backends", default="sim", help="comma list of sim, vllm")
    p.add_argument("--vllm-model", default="smollm2-135m")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="save the measured un-hidden gaps as an overhead profile for "
                        "`simulate --overhead-profile` ({backend} in FILE: one per backend)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="the scheduler's overlap scheduling (default on, as the scheduler's)")
    args = p.parse_args()
    os.environ["SLOSERVE_OVERLAP"] = "1" if args.overlap else "0"  # the scheduler's default
    for backend in args.backends.split(","):
        if backend not in ("sim", "vllm"):
            p.error(f"--backends: unknown {backend!r}; use sim and/or vllm")
        kw: dict[str, object] = (
            {"num_blocks": args.num_blocks, "time_scale": args.time_scale} if backend == "sim"
            else {"backend": "vllm", "model": args.vllm_model, "gpu": "cpu"})
        cfg = StackConfig(policy=args.policy, gateway_port=free_port(), redis_url=args.redis_url,
                          log_dir=Path(tempfile.mkdtemp(prefix="sloserve-overhead-")),
                          **kw)  # type: ignore[arg-type]
        with Stack(cfg) as stack:
            print(json.dumps(asyncio.run(measure(stack, args))), flush=True)


if __name__ == "__main__":
    main()
