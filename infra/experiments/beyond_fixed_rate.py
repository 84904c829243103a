"""Goodput share at fixed rates where capacity is 0 for every policy (hetero SLOs).

Usage: python infra/experiments/beyond_fixed_rate.py [--num-requests K] [--trace T]
       [--rates 1,2] [--policies slack,vllm,sarathi] [--out FILE.json]

AccelGen's heterogeneous mix makes ~30 % of requests infeasible (TTFT SLO below the
prompt's own prefill), so no policy reaches a 0.9 goodput share and every capacity
is 0. This compares shares at fixed rates, next to the bound's feasible share.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sloserve.perf.ground_truth import ProfileTiming
from sloserve.perf.models import get_model
from sloserve.sim.bound import goodput_bound
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import build_timing, build_workload, simulate

KEYS = ("goodput_share", "token_criterion_share", "ttft_p50", "ttft_p99", "tbt_token_p99",
        "dropped")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=600)
    ap.add_argument("--trace", default="sharegpt")
    ap.add_argument("--rates", default="1,2")
    ap.add_argument("--policies", default="slack,vllm,sarathi")
    ap.add_argument("--out", default="docs/results/beyond_hetero_fixed.json")
    a = ap.parse_args(argv)
    base = SimConfig(policy="vllm", trace=a.trace, num_requests=a.num_requests, ttft_slo=None,
                     tbt_slo=0.1875, slo_mix="hetero")
    reqs = build_workload(base, get_model(base.model), build_timing(base)).requests
    bound = goodput_bound(reqs, ProfileTiming(base.model, base.gpu, noise_cv=0.0), qps=base.qps)
    rows: list[dict[str, Any]] = []
    for rate in (float(x) for x in a.rates.split(",")):
        for p in a.policies.split(","):
            s = simulate(SimConfig(policy=p, trace=a.trace, num_requests=a.num_requests,
                                   ttft_slo=None, tbt_slo=0.1875, slo_mix="hetero", qps=rate))
            rows.append({"policy": p, "qps": rate, **{k: s[k] for k in KEYS}})
            print(rows[-1], flush=True)
    with open(a.out, "w") as f:
        json.dump({"num_requests": a.num_requests, "trace": a.trace,
                   "feasible_share": bound["feasible"] / bound["requests"], "bound": bound,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
