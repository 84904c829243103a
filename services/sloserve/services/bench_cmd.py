"""``sloserve bench``: replay a workload against a running gateway through the SDK.

``--endpoint openai`` replays the same workload against any OpenAI-compatible
server instead (stock ``vllm serve``): ``bench_openai``.

The workload is built exactly as ``sloserve simulate`` builds it (same trace,
seed, arrivals and SLOs), each request is sent at its arrival offset with a
prompt of its exact token length, and the measured token times (the
gateway's clock, DESIGN.md: TTFT from arrival at the gateway) go through the
same ``sloserve.metrics.summarize``, so the JSON keys match ``simulate``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sloserve.defaults import TBT_SLO, TTFT_SLO, workload_slos
from sloserve.request import Request, RequestStatus


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="replay a workload against a running gateway")
    p.add_argument("--endpoint", choices=("grpc", "openai"), default="grpc",
                   help="grpc: our gateway (default); openai: any OpenAI-compatible server")
    p.add_argument("--target", default="127.0.0.1:50051",
                   help="gateway address (grpc) or http://HOST:PORT (openai)")
    p.add_argument("--model", default=None,
                   help="openai: served model name (default: the first of GET /v1/models)")
    p.add_argument("--workload-model", default=None,
                   help="openai: model preset whose max context caps the workload "
                        "(default: the served name)")
    p.add_argument("--gpu", default="a100",
                   help="openai: hardware whose profile scales a --slo-mix hetero workload")
    p.add_argument("--temperature", type=float, default=0.0, help="openai: sampling temperature")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="sharegpt | arxiv | bwb | azure-conv | azure-code")
    src.add_argument("--trace-file", help="CSV/JSONL with prompt and output token columns")
    p.add_argument("--qps", type=float, required=True)
    p.add_argument("--num-requests", type=int, required=True)
    p.add_argument("--ttft-slo", type=float, default=None, help=f"seconds (default {TTFT_SLO})")
    p.add_argument("--tbt-slo", type=float, default=None, help=f"seconds (default {TBT_SLO})")
    p.add_argument("--slo-mix", choices=("hetero",), default=None)
    p.add_argument("--jct-share", type=float, default=0.0,
                   help="with --slo-mix hetero: share of offline JCT-SLO requests (AccelGen §4.3)")
    p.add_argument("--arrival", choices=("poisson", "gamma", "trace"), default="poisson")
    p.add_argument("--cv", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")


def workload(args: argparse.Namespace, model: str, gpu: str) -> list[Request]:
    """The requests ``sloserve simulate`` would generate for the same flags (a hetero
    SLO mix scales TTFT SLOs by the served GPU's profiled prompt latencies, as simulate)."""
    from sloserve.perf.models import get_model
    from sloserve.sim.config import SimConfig
    from sloserve.sim.simulator import build_timing, build_workload

    ttft, tbt = workload_slos(args.ttft_slo, args.tbt_slo, args.slo_mix)
    cfg = SimConfig(
        policy="sarathi", model=model, trace=args.trace, trace_file=args.trace_file,
        qps=args.qps, num_requests=args.num_requests, ttft_slo=ttft, tbt_slo=tbt,
        slo_mix=args.slo_mix, jct_share=args.jct_share, arrival=args.arrival, cv=args.cv,
        seed=args.seed, gpu=gpu,
    )
    cfg.validate()
    timing = build_timing(cfg) if args.slo_mix else None
    reqs: list[Request] = build_workload(cfg, get_model(model), timing).requests  # type: ignore[arg-type,unused-ignore]
    return reqs


def prompt_ids(req: Request) -> list[int]:
    """A prompt of exactly ``prompt_len`` byte-level tokens (printable ASCII), drawn from a
    generator seeded by the request id: deterministic, and distinct requests share no
    prefix, so a server with prefix caching (stock vLLM's default) gets no hits that the
    trace's real prompts would not give it."""
    rng = random.Random(req.request_id)
    return [rng.randrange(32, 127) for _ in range(req.prompt_len)]


async def _one(client: Any, req: Request, t0: float, bar: Any) -> None:
    from sloserve.client import RequestDropped, SloserveError

    await asyncio.sleep(max(0.0, t0 + req.arrival_time - time.monotonic()))
    try:
        async for c in client.generate(
            prompt_token_ids=prompt_ids(req), max_tokens=req.output_len, ttft_slo=req.slo.ttft,
            tbt_slo=req.slo.tbt, jct_slo=req.slo.jct, priority=req.priority,
            ignore_eos=True,  # exact output lengths, as simulate (vllm bench --ignore-eos)
        ):
            req.arrival_time = c.arrival_time
            req.token_times.append(c.time)
            req.num_generated = c.index + 1
            req.num_offloads = c.num_offloads
            if c.finish_reason:
                req.status, req.finish_time = RequestStatus.FINISHED, c.time
    except RequestDropped:
        req.status, req.finish_time = RequestStatus.DROPPED, time.time()
    except SloserveError as exc:
        print(f"request {req.request_id}: {exc.code.name}: {exc.details}", file=sys.stderr)
    if bar is not None:
        bar.update(1)


async def send_all(reqs: list[Request], one: Callable[[Request, float, Any], Awaitable[None]]
                   ) -> None:
    """Send every request at its arrival offset (``one(req, t0, bar)``), a progress bar on a
    terminal; the measured times replace the workload's synthetic ones."""
    for r in reqs:
        r.token_times, r.status, r.num_generated = [], RequestStatus.WAITING, 0
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(reqs), unit="req", file=sys.stderr)
    t0 = time.monotonic()
    await asyncio.gather(*(one(r, t0, bar) for r in reqs))
    if bar is not None:
        bar.close()


async def replay(target: str, args: argparse.Namespace) -> dict[str, Any]:
    from sloserve.client import AsyncClient
    from sloserve.metrics import summarize

    async with AsyncClient(target) as client:
        info = await client.info()
        reqs = workload(args, info["model"], info["instances"][0]["hardware"])
        await send_all(reqs, lambda r, t0, bar: _one(client, r, t0, bar))
    out: dict[str, Any] = dict(summarize(reqs))
    out.update(policy=",".join(info["policies"]), instances=len(info["instances"]),
               model=info["model"], qps=args.qps, seed=args.seed, measured=True,
               offloads=sum(r.num_offloads for r in reqs), endpoint="grpc", target=target)
    return out


def run(args: argparse.Namespace) -> int:
    from sloserve.metrics import format_table

    if not args.qps > 0:
        raise ValueError(f"qps (--qps): must be > 0, got {args.qps}")
    if args.num_requests < 1:
        raise ValueError(f"num_requests (--num-requests): must be >= 1, got {args.num_requests}")
    if args.endpoint == "openai":
        from sloserve.services import bench_openai

        out = asyncio.run(bench_openai.replay(args))
    else:
        out = asyncio.run(replay(args.target, args))
    if args.json:
        print(json.dumps(out))
    else:
        print(format_table(out))
    return 0 if out["completed"] + out["dropped"] == out["requests"] else 1
