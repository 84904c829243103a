"""Issue 2 acceptance: capacity of every policy under all three criteria.

Usage: python infra/experiments/core_capacity.py [--num-requests K] [--jobs J] [--out FILE.json]

Setups (llama-3-8b on a100, ShareGPT, TTFT SLO 1 s):
  a) one instance, TBT SLO 0.1 s (strict) and 0.5 s (relaxed): vllm, sarathi, accelgen
  b) three instances, TBT 0.15 s: vllm x3, sarathi x3, ascendra 2LP+1HP, accelgen x3
  c) heterogeneous SLOs (--slo-mix hetero), one instance: every policy that runs on one
Each setup's probes are shared by the three criteria (one simulation per rate).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sloserve.policies import get_spec, policy_names
from sloserve.sim.capacity import find_capacity
from sloserve.sim.config import SimConfig

CRITERIA = ("goodput", "tail", "token")


def setups(k: int) -> list[tuple[str, SimConfig]]:
    base: dict[str, Any] = dict(model="llama-3-8b", gpu="a100", trace="sharegpt", num_requests=k,
                                ttft_slo=1.0)
    hetero = {**base, "ttft_slo": None, "tbt_slo": 0.1875, "slo_mix": "hetero"}
    out: list[tuple[str, SimConfig]] = []
    for tbt in (0.1, 0.5):
        for p in ("vllm", "sarathi", "accelgen"):
            out.append((f"a/tbt{tbt}/{p}", SimConfig(policy=p, tbt_slo=tbt, **base)))
    for p in policy_names():
        hp = get_spec(p).default_hp(3)
        out.append((f"b/x3/{p}", SimConfig(policy=p, instances=3, hp_instances=hp,
                                           tbt_slo=0.15, **base)))
    for p in ("vllm", "sarathi", "accelgen"):
        out.append((f"c/hetero/{p}", SimConfig(policy=p, **hetero)))
    out.append(("c/hetero/ascendra-1L1H", SimConfig(policy="ascendra", instances=2,
                                                    hp_instances=1, **hetero)))
    return out


def run_setup(item: tuple[str, SimConfig]) -> dict[str, Any]:
    name, cfg = item
    t0 = time.time()
    cache: dict[float, dict[str, Any]] = {}
    start = 1.0 * cfg.instances
    res = {c: find_capacity(cfg, c, 0.9, qps_start=start, cache=cache) for c in CRITERIA}
    return {"setup": name, "capacity": {c: r["capacity_qps"] for c, r in res.items()},
            "at_limit": {c: r["at_search_limit"] for c, r in res.items()},
            "probes": {c: r["probes"] for c, r in res.items()},
            "simulations": len(cache), "wall_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="substring filter on setup names")
    ap.add_argument("--out", default="docs/results/core_capacity.json")
    a = ap.parse_args()
    items = [s for s in setups(a.num_requests) if a.only in s[0]]
    print(f"{'setup':28} {'goodput':>9} {'tail':>9} {'token':>9} {'sims':>5} {'wall_s':>7}",
          flush=True)
    results = []
    with ProcessPoolExecutor(a.jobs) as pool:
        for r in pool.map(run_setup, items):
            results.append(r)
            c, lim = r["capacity"], r["at_limit"]
            cells = [f"{'>=' if lim[k] else ''}{c[k]:.3f}" for k in CRITERIA]
            print(f"{r['setup']:28} {cells[0]:>9} {cells[1]:>9} {cells[2]:>9} "
                  f"{r['simulations']:5d} {r['wall_s']:7.1f}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"num_requests": a.num_requests, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
