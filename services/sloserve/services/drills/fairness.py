"""Per-tenant fairness at the gateway (issue 36, item 7), as ``tests/services/test_fairness.py``
and ``infra/experiments/fairness_two_keys.py`` run it: one API key floods at 5x its normal
rate, another sends at its normal rate, on the overload drill's stack (sim backend slowed
4x, sarathi, one instance, 1024-token prompts, 32 output tokens: capacity 2.75 req/s).
Each key may use 40 % of it in tokens; key B sends at 30 % of capacity, key A at 5x that.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.client import AsyncClient, RequestDropped, SloserveError
from sloserve.services.drills.overload import CAPACITY, OUTPUT, PROMPT, TBT, TTFT
from sloserve.services.stack import Stack
from sloserve.tenancy import KeyLimits

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
NORMAL = 0.3 * CAPACITY  # key B's rate; key A floods at 5x that
SHARE = 0.4 * CAPACITY * (PROMPT + OUTPUT)  # tokens/s each key may use
LIMITS = KeyLimits(max_inflight=16, token_rate=SHARE, token_burst=8 * (PROMPT + OUTPUT))


def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A}\n{KEY_B}\n")
    return str(path)


def run_fairness(stack: Stack, duration_s: float = 30.0, flood: float = 5.0,
                 seed: int = 0) -> dict[str, Any]:
    """Poisson arrivals: key B at ``NORMAL`` req/s, key A at ``flood`` x that, for
    ``duration_s``; per key: sent, met both SLOs, shed, and the shed reasons."""
    rng = np.random.default_rng(seed)
    plan: list[tuple[float, str]] = []
    for key, qps in ((KEY_A, flood * NORMAL), (KEY_B, NORMAL)):
        t = np.cumsum(rng.exponential(1 / qps, int(qps * duration_s * 1.5) + 10))
        plan += [(float(x), key) for x in t[t < duration_s]]
    plan.sort()
    stats: dict[str, dict[str, Any]] = {
        k: {"sent": 0, "good": 0, "completed": 0, "shed": 0, "errors": [],
            "reasons": set(), "ttft": []} for k in (KEY_A, KEY_B)}

    async def one(k: int, client: AsyncClient, t0: float) -> None:
        at, key = plan[k]
        s = stats[key]
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        s["sent"] += 1
        times: list[float] = []
        arrival = 0.0
        try:
            async for c in client.generate(prompt_token_ids=[65 + k % 50] * PROMPT,
                                           max_tokens=OUTPUT, ttft_slo=TTFT, tbt_slo=TBT,
                                           ignore_eos=True, timeout=300):
                times.append(c.time)
                arrival = c.arrival_time
        except RequestDropped as exc:
            s["shed"] += 1
            s["reasons"].add(exc.details.split(": ", 1)[-1][:48])
            return
        except SloserveError as exc:
            s["errors"].append(f"{exc.code.name}: {exc.details}")
            return
        s["completed"] += 1
        ttft = times[0] - arrival
        s["ttft"].append(ttft)
        tbt = (times[-1] - times[0]) / (len(times) - 1)
        s["good"] += len(times) == OUTPUT and ttft <= TTFT and tbt <= TBT

    async def main() -> None:
        clients = {k: AsyncClient(stack.gateway, api_key=k) for k in (KEY_A, KEY_B)}
        t0 = time.monotonic()
        await asyncio.gather(*(one(k, clients[key], t0) for k, (_, key) in enumerate(plan)))
        for c in clients.values():
            await c.close()

    asyncio.run(main())
    out: dict[str, Any] = {"duration_s": duration_s, "flood": flood, "normal_qps": NORMAL,
                           "capacity_qps": CAPACITY, "seed": seed}
    for name, key in (("flooding_key", KEY_A), ("normal_key", KEY_B)):
        s = stats[key]
        out[name] = {
            "sent": s["sent"], "completed": s["completed"], "shed": s["shed"],
            "met_slo": s["good"], "slo_attainment": s["good"] / s["sent"] if s["sent"] else None,
            "ttft_p99_s": float(np.percentile(s["ttft"], 99)) if s["ttft"] else None,
            "errors": s["errors"][:3], "reasons": sorted(s["reasons"])[:3],
        }
    return out
