"""The overload drill (docs/reliability.md): Poisson arrivals at a multiple of capacity
against the sim backend slowed 4x (``time_scale``), SLOs scaled alike (TTFT 4 s, TBT 0.6 s;
the token budget kept at the unscaled SLO's 512), so a 2-core host keeps up with the
client side: sarathi's goodput capacity for 1024-token prompts and 32 output tokens is
11 req/s on the A100 profile (``find_capacity``, 300 requests, seed 1), 2.75 req/s
slowed."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from sloserve.admission import Admission
from sloserve.client import AsyncClient, RequestDropped, SloserveError
from sloserve.policies.sarathi import SarathiConfig
from sloserve.services.stack import Stack

TIME_SCALE = 4.0
TTFT, TBT = 1.0 * TIME_SCALE, 0.15 * TIME_SCALE
CAPACITY = 11.0 / TIME_SCALE
PROMPT, OUTPUT = 1024, 32
# the budget the unscaled TBT SLO (0.15 s, strict) gives: the scaled one would relax it
STACK = dict(policy="sarathi", time_scale=TIME_SCALE, ttft_slo=TTFT, tbt_slo=TBT,
             policy_config=SarathiConfig(token_budget=512),
             admission=Admission(),  # `up --admission` (off by default, as vLLM)
             prefix_caching=False)  # CAPACITY is without it: the 50 prompts repeat


@contextlib.contextmanager
def busy_core() -> Iterator[int]:
    """A second process keeping one core busy (issue 36, item 3: a host doing other
    work) for the block's duration; yields its pid."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _rss(stack: Stack) -> dict[str, float]:
    return {n: rss_mb(s.proc.pid) for n, s in stack.services.items()
            if s.proc is not None and n in ("gateway", "scheduler-lp0")}


def run_overload(stack: Stack, load: float = 3.0, duration_s: float = 15.0,
                 seed: int = 0) -> dict[str, Any]:
    """Poisson arrivals at ``load`` x capacity for ``duration_s``; per request: shed
    (and how fast), or its TTFT and mean TBT."""
    rng = np.random.default_rng(seed)
    qps = load * CAPACITY
    gaps = rng.exponential(1 / qps, int(qps * duration_s * 1.5) + 10)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration_s]
    shed_s: list[float] = []
    reasons: set[str] = set()
    good, admitted, errors = 0, 0, []
    ttfts: list[float] = []
    tbts: list[float] = []

    async def one(k: int, client: AsyncClient, t0: float) -> None:
        nonlocal good, admitted
        await asyncio.sleep(max(0.0, t0 + arrivals[k] - time.monotonic()))
        sent = time.monotonic()
        times: list[float] = []
        arrival = 0.0
        try:
            async for c in client.generate(prompt_token_ids=[65 + k % 50] * PROMPT,
                                           max_tokens=OUTPUT, ttft_slo=TTFT, tbt_slo=TBT,
                                           ignore_eos=True, timeout=300):
                times.append(c.time)
                arrival = c.arrival_time
        except RequestDropped as exc:
            shed_s.append(time.monotonic() - sent)
            reasons.add(exc.details.split(": ", 1)[-1].split(" on ")[0][:40])
            return
        except SloserveError as exc:
            errors.append(f"{exc.code.name}: {exc.details}")
            return
        admitted += 1
        ttfts.append(times[0] - arrival)
        tbts.append((times[-1] - times[0]) / (len(times) - 1))
        ok = len(times) == OUTPUT and ttfts[-1] <= TTFT and tbts[-1] <= TBT
        good += ok

    async def main() -> None:
        async with AsyncClient(stack.gateway) as client:
            t0 = time.monotonic()
            await asyncio.gather(*(one(k, client, t0) for k in range(len(arrivals))))

    before = _rss(stack)
    wall = time.monotonic()
    asyncio.run(main())
    wall = time.monotonic() - wall
    after = _rss(stack)
    p50, p99 = (np.percentile(shed_s, (50, 99)) if shed_s else (float("nan"),) * 2)
    return {
        "load": load, "qps": qps, "duration_s": duration_s, "wall_s": wall,
        "requests": len(arrivals), "admitted": admitted, "shed": len(shed_s),
        "errors": errors, "good_admitted": good,
        "goodput_share_admitted": good / admitted if admitted else None,
        "shed_latency_p50_s": float(p50), "shed_latency_p99_s": float(p99),
        "shed_latency_max_s": max(shed_s, default=float("nan")),
        "ttft_admitted_p50_s": float(np.percentile(ttfts, 50)) if ttfts else None,
        "ttft_admitted_p99_s": float(np.percentile(ttfts, 99)) if ttfts else None,
        "mean_tbt_admitted_p99_s": float(np.percentile(tbts, 99)) if tbts else None,
        "shed_reasons": sorted(reasons)[:3], "rss_before_mb": before, "rss_after_mb": after,
        "time_scale": TIME_SCALE, "ttft_slo": TTFT, "tbt_slo": TBT, "prompt": PROMPT,
        "output": OUTPUT,
    }
