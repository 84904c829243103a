"""Ascendra §8.4 (Fig. 11 left): the LP value function, EDF vs FCFS vs SJF.

Paper: 2 LP + 1 HP, Mistral-7B on ShareGPT; "Ascendra-EDF achieves higher
goodput than Ascendra-SJF" across request rates (no numbers in the text).
Here: the simulator, Ascendra 2L1H, llama-3-8b on the A100 profile, ShareGPT,
TTFT 1 s / TBT 0.15 s, Poisson arrivals; every value function at every rate in
``--qps``, all other knobs at their defaults. Writes one JSON object to
``--out`` with the paper's claim, our goodput per (value function, rate) and
the setup.

    python infra/experiments/ascendra_value_functions.py [--qps 8,9,10] [--num-requests 1500]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sloserve.policies.ascendra import AscendraConfig
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

PAPER = {"claim": "EDF goodput > SJF goodput at every rate", "source": "Ascendra §8.4, Fig. 11"}
VALUE_FUNCTIONS = ("edf", "fcfs", "sjf")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--qps", default="8,9,10", help="comma-separated rates for all 3 GPUs")
    ap.add_argument("--num-requests", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/ascendra_value_functions.json")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rates = [float(q) for q in a.qps.split(",")]
    rows = []
    for qps in rates:
        for vf in VALUE_FUNCTIONS:
            out = simulate(SimConfig(policy="ascendra", instances=3, hp_instances=1, qps=qps,
                                     num_requests=a.num_requests, seed=a.seed,
                                     policy_config=AscendraConfig(value_function=vf)))
            rows.append({"value_function": vf, "qps": qps, "goodput_share": out["goodput_share"],
                         "good": out["good"], "ttft_p99": out["ttft_p99"],
                         "mean_tbt_p99": out["mean_tbt_p99"], "offloads": out["offloads"]})
    share = {(r["value_function"], r["qps"]): r["goodput_share"] for r in rows}
    result = {
        "experiment": "ascendra-value-functions",
        "paper": PAPER,
        "ours": {
            "edf_beats_sjf_at": [q for q in rates if share["edf", q] > share["sjf", q]],
            "edf_beats_fcfs_at": [q for q in rates if share["edf", q] > share["fcfs", q]],
            "rates": rates,
            "goodput_share": {vf: [share[vf, q] for q in rates] for vf in VALUE_FUNCTIONS},
        },
        "setup": {"model": "llama-3-8b", "gpu": "a100", "trace": "sharegpt", "deployment": "2L1H",
                  "num_requests": a.num_requests, "seed": a.seed, "ttft_slo": 1.0,
                  "tbt_slo": 0.15, "paper_setup": "Mistral-7B, 3 x A100-80G, real runs"},
        "rows": rows,
        "command": "python infra/experiments/ascendra_value_functions.py "
                   f"--qps {a.qps} --num-requests {a.num_requests} --seed {a.seed}",
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main()["ours"], indent=1))
