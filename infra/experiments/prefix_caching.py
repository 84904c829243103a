"""Issue 13 item 1: prefix caching on a multi-turn workload, and prefix-aware routing.

One policy (``--policy``, default Sarathi-Serve; llama-3-8b, simulated A100s) on
the synthetic multi-turn chat workload (``--trace multiturn``: conversations
resend their history, four shared system prompts). Part 1, one instance:
capacity (goodput >= 90%) with and without prefix caching, and hit rate / TTFT
P50 / P99 at the same arrival rate (the capacity without caching). Part 2, four
instances with caching: prefix-aware routing vs round-robin, capacity and hit
rate / TTFT at one rate.

Usage: python infra/experiments/prefix_caching.py [--policy P] [--num-requests K] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from sloserve.defaults import TBT_SLO, TTFT_SLO
from sloserve.policies import policy_names
from sloserve.sim.capacity import find_capacity
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate
from sloserve.workload.multiturn import MultiTurnSpec

KEYS = ("goodput_share", "ttft_p50", "ttft_p99", "tbt_token_p99", "prefix_hit_rate",
        "prefix_evictions", "prefix_routed_to_match", "preemptions", "kv_utilization")


def _row(cfg: SimConfig, qps: float) -> dict[str, Any]:
    out = simulate(dataclasses.replace(cfg, qps=qps))
    return {"qps": qps, **{k: out.get(k) for k in KEYS}}


def _capacity(cfg: SimConfig, qps_start: float) -> float:
    return float(find_capacity(cfg, "goodput", 0.9, qps_start=qps_start)["capacity_qps"])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="sarathi", choices=policy_names())
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/prefix_caching.json")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    base = SimConfig(policy=a.policy, trace="multiturn", num_requests=a.num_requests,
                     seed=a.seed, ttft_slo=TTFT_SLO, tbt_slo=TBT_SLO)

    single: dict[str, Any] = {}
    for caching in (False, True):
        cfg = dataclasses.replace(base, prefix_caching=caching)
        single["on" if caching else "off"] = {"capacity_qps": _capacity(cfg, 1.0)}
    at = single["off"]["capacity_qps"]
    for key, caching in (("off", False), ("on", True)):
        cfg = dataclasses.replace(base, prefix_caching=caching)
        single[key]["at_off_capacity"] = _row(cfg, at)
        print(json.dumps({"instances": 1, "caching": key, **single[key]}), flush=True)
    single["capacity_gain"] = round(single["on"]["capacity_qps"] / at, 3) if at else None

    four: dict[str, Any] = {}
    multi = dataclasses.replace(base, instances=4, num_requests=4 * a.num_requests)
    for key, routing in (("round_robin", False), ("prefix_aware", True)):
        cfg = dataclasses.replace(multi, prefix_routing=routing)
        four[key] = {"capacity_qps": _capacity(cfg, 4 * single["on"]["capacity_qps"] / 2)}
    at4 = four["round_robin"]["capacity_qps"]
    for key, routing in (("round_robin", False), ("prefix_aware", True)):
        cfg = dataclasses.replace(multi, prefix_routing=routing)
        four[key]["at_round_robin_capacity"] = _row(cfg, at4)
        print(json.dumps({"instances": 4, "routing": key, **four[key]}), flush=True)
    four["capacity_gain"] = round(four["prefix_aware"]["capacity_qps"] / at4, 3) if at4 else None

    result = {
        "setup": {
            "policy": a.policy, "model": base.model, "gpu": base.gpu,
            "workload": {"trace": "multiturn", **dataclasses.asdict(MultiTurnSpec())},
            "num_requests_per_instance": a.num_requests, "seed": a.seed,
            "ttft_slo_s": TTFT_SLO, "tbt_slo_s": TBT_SLO,
            "capacity_criterion": "goodput_share >= 0.9 (Poisson arrivals, bisection)",
            "routing_load_bound": "waiting prefills within 4 of the least loaded instance",
            "command": "python infra/experiments/prefix_caching.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
        },
        "one_instance": single,
        "four_instances": four,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
