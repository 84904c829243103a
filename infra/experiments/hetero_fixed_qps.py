"""Issue 2 (c) beside capacity: every policy under AccelGen's heterogeneous SLOs
at fixed arrival rates, one instance (llama-3-8b, a100, ShareGPT).

Usage: python infra/experiments/hetero_fixed_qps.py [--qps 1,2,3] [--num-requests K]
"""

from __future__ import annotations

import argparse
import json

from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

KEYS = ("goodput_share", "token_criterion_share", "token_slo_attainment", "ttft_p50", "ttft_p99",
        "tbt_token_p99", "mean_tbt_p99", "sched_delay_p50", "preemptions", "offloads")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qps", default="1,2,3")
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--out", default="docs/results/hetero_fixed_qps.json")
    a = ap.parse_args()
    rows = []
    for qps in (float(q) for q in a.qps.split(",")):
        for policy, n, hp in (("vllm", 1, 0), ("sarathi", 1, 0), ("accelgen", 1, 0),
                              ("ascendra", 1, 0), ("ascendra", 2, 1)):
            cfg = SimConfig(policy=policy, instances=n, hp_instances=hp, trace="sharegpt",
                            qps=qps * n, num_requests=a.num_requests, ttft_slo=None,
                            tbt_slo=0.1875, slo_mix="hetero")
            out = simulate(cfg)
            name = policy if hp == 0 else f"{policy}-{n - hp}L{hp}H"
            rows.append({"policy": name, "qps_per_instance": qps, **{k: out[k] for k in KEYS}})
            print(json.dumps(rows[-1]), flush=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
