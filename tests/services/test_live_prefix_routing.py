"""Prefix-aware routing live (issue 33, item 4): ``up --prefix-routing`` builds the
simulator's ``PrefixRouter`` in the gateway's controller, and the gateway's ``/metrics``
exports vLLM's prefix-cache counters per instance (label ``engine``)."""

from __future__ import annotations

import asyncio
import random
import re
import urllib.request
from pathlib import Path

from redis_source import redis_url

from sloserve.client import AsyncClient
from sloserve.request import Request, RequestStatus
from sloserve.services.bench_cmd import _one, send_all
from sloserve.services.cli import build_parser
from sloserve.services.stack import Stack
from sloserve.services.up_cmd import config_from_args
from sloserve.workload.multiturn import MultiTurnSpec, multiturn_requests

REDIS_URL = redis_url()
INSTANCES = 4
# short conversations with quick turns, so a 60-request run holds many follow-up turns
SPEC = MultiTurnSpec(mean_turns=5.0, max_turns=8, mean_user_tokens=60.0,
                     mean_output_tokens=12.0, mean_think_s=0.6)


def prefix_counters(http: str) -> dict[str, tuple[float, float]]:
    """engine -> (queries, hits) from the gateway's ``/metrics``."""
    text = urllib.request.urlopen(f"{http}/metrics", timeout=10).read().decode()
    out: dict[str, list[float]] = {}
    for name, k in (("queries", 0), ("hits", 1)):
        for engine, value in re.findall(
                rf'^vllm:prefix_cache_{name}_total{{[^}}]*engine="([^"]+)"[^}}]*}} (\S+)$',
                text, re.M):
            out.setdefault(engine, [0.0, 0.0])[k] = float(value)
    return {e: (q, h) for e, (q, h) in out.items()}


def run_multiturn(tmp_path: Path, routing: bool) -> dict[str, tuple[float, float]]:
    port, http = random.sample(range(20000, 30000), 2)
    args = build_parser().parse_args([
        "up", "--instances", str(INSTANCES), "--port", str(port), "--http-port", str(http),
        "--redis-url", REDIS_URL, "--log-dir", str(tmp_path / f"logs-{routing}"),
        *(["--prefix-routing"] if routing else [])])
    cfg = config_from_args(args)
    assert cfg.prefix_routing is routing and cfg.prefix_caching
    stack = Stack(cfg).start()
    try:
        reqs: list[Request] = multiturn_requests(num_requests=60, qps=10.0, seed=3,
                                                 spec=SPEC).requests

        async def drive() -> None:
            client = AsyncClient(stack.gateway)
            await send_all(reqs, lambda r, t0, bar: _one(client, r, t0, bar), progress=False)

        asyncio.run(drive())
        assert all(r.status == RequestStatus.FINISHED for r in reqs)
        return prefix_counters(stack.http)
    finally:
        stack.stop()


def test_prefix_routing_live_gets_more_prefix_hits_than_round_robin(tmp_path: Path) -> None:
    rates = {}
    for routing in (False, True):
        counts = run_multiturn(tmp_path, routing)
        assert sorted(counts) == [f"lp{k}" for k in range(INSTANCES)]  # one series each
        queries = sum(q for q, _ in counts.values())
        hits = sum(h for _, h in counts.values())
        assert queries > 0
        rates[routing] = hits / queries
    print(rates)
    assert rates[True] > rates[False] + 0.05, rates
