"""Regenerate ``tests/sim/data/golden_summaries.json``: exact-mode summaries the simulator
must keep reproducing bit for bit (tests/sim/test_golden.py).

Run only when a behaviour change is intended (a policy, the ground truth, the workload),
and say so in the commit: the speed work of issue 13 must leave every figure unchanged.

    PYTHONPATH=shared python infra/experiments/sim_golden.py tests/sim/data/golden_summaries.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

CASES: dict[str, dict[str, Any]] = {
    "sarathi_1x": dict(policy="sarathi", trace="sharegpt", qps=3.0, num_requests=400,
                       ttft_slo=1.0, tbt_slo=0.1, seed=5),
    "vllm_2x": dict(policy="vllm", trace="sharegpt", instances=2, qps=6.0, num_requests=400,
                    ttft_slo=1.0, tbt_slo=0.1, seed=5),
    "ascendra_2l1h": dict(policy="ascendra", trace="sharegpt", instances=3, hp_instances=1,
                          qps=12.0, num_requests=400, ttft_slo=0.5, tbt_slo=0.1, seed=5),
    "accelgen_hetero": dict(policy="accelgen", trace="sharegpt", qps=4.0, num_requests=300,
                            slo_mix="hetero", jct_share=0.2, seed=5),
    "vllm_preempt": dict(policy="vllm", trace="sharegpt", qps=4.0, num_requests=300,
                         num_blocks=1200, ttft_slo=1.0, tbt_slo=0.1, seed=5),
}
UNPINNED = ("sim_wall_s",)  # wall time is the one field that may differ


def golden() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kw in CASES.items():
        s = simulate(SimConfig(**kw))
        for key in UNPINNED:
            s.pop(key)
        out[name] = {"config": kw, "summary": s}
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(golden(), f, indent=1, sort_keys=True)
