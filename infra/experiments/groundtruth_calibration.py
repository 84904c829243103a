"""Issue 10 point 15: the ground truth before and after the Sarathi calibration.

Usage: python infra/experiments/groundtruth_calibration.py [--num-requests K] [--seeds 0 1]
       [--jobs J] [--out docs/results/groundtruth_calibration.json]

1. Fidelity (noiseless, llama-3-8b/a100): the prefill time of a prompt chunked at
   512/1024/2048 relative to unchunked (each chunk one iteration, as the simulator runs
   it), the 4k -> 8k prefill growth and the 256 -> 257 step, for ``calibrated=False``
   (the previous ground truth) and ``True``; next to Sarathi-Serve's measured figures
   (Yi-34B TP2, from the vendored CSVs).
2. Capacity (the bisection of ``sloserve capacity``) of vllm and sarathi, llama-3-8b/a100,
   ShareGPT, TTFT 1 s, TBT 0.1 s, criteria goodput and tail (P99 TBT), before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from sloserve.batch import BatchShape
from sloserve.perf import sarathi_calibration as sc
from sloserve.perf.ground_truth import ProfileTiming
from sloserve.sim.capacity import find_capacity
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

CRITERIA = ("goodput", "tail")
PROMPTS = (2047, 4095, 8191, 16383)
CHUNKS = (512, 1024, 2048)


def fidelity(calibrated: bool) -> dict[str, Any]:
    gt = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0, calibrated=calibrated)

    def pf(c: int, ctx: int = 0) -> float:
        return gt.noiseless_time(BatchShape(prefills=((c, ctx),)))

    def chunked(p: int, c: int) -> float:
        return sum(pf(n, ctx) for n, ctx in sc.chunks(p, c))

    return {
        "chunking_relative": {f"{p}@{c}": round(chunked(p, c) / pf(p), 4)
                              for p in PROMPTS for c in CHUNKS},
        "growth_4k_to_8k": round(pf(8192) / pf(4096), 4),
        "step_256_to_257": round(pf(257) / pf(256), 4),
    }


def published() -> dict[str, Any]:
    rows = {(p, c): t for p, c, t in sc.chunking_rows()}
    x, y = sc.prefill_curve()
    return {
        "setup": "Yi-34B, TP2, A100 80GB PCIe (Sarathi-Serve OSDI'24 artifact)",
        "chunking_relative": {f"{p}@{c}": round(rows[(p, c)] / rows[(p, sc.UNCHUNKED)], 4)
                              for p in PROMPTS for c in CHUNKS},
        "growth_4k_to_8k": round(float(np.interp(8192, x, y) / np.interp(4096, x, y)), 4),
        "step_256_to_257": "1.32 (Sarathi-Serve §4.3, text: 'in some cases')",
        "context_attention_efficiency": round(sc.context_attention_efficiency(), 4),
        "causal_attention_efficiency": round(sc.causal_attention_efficiency(), 4),
    }


def run_setup(item: tuple[str, str, bool, int, int]) -> dict[str, Any]:
    name, policy, calibrated, seed, k = item
    t0 = time.time()
    cfg = SimConfig(policy=policy, model="llama-3-8b", gpu="a100", trace="sharegpt",
                    num_requests=k, ttft_slo=1.0, tbt_slo=0.1, seed=seed)

    def run(c: SimConfig) -> dict[str, Any]:  # the CLI's ground truth, calibrated or not
        timing = ProfileTiming(c.model, c.gpu, seed=c.seed, noise_cv=c.noise_cv, tp=c.tp,
                               calibrated=calibrated)
        return simulate(dataclasses.replace(c, timing=timing))

    cache: dict[float, dict[str, Any]] = {}
    res = {c: find_capacity(cfg, c, 0.9, cache=cache, run=run) for c in CRITERIA}
    return {"setup": name, "policy": policy, "calibrated": calibrated, "seed": seed,
            "capacity": {c: r["capacity_qps"] for c, r in res.items()},
            "probes": {c: r["probes"] for c, r in res.items()},
            "simulations": len(cache), "wall_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="docs/results/groundtruth_calibration.json")
    a = ap.parse_args()
    fid = {"before": fidelity(False), "after": fidelity(True), "published": published()}
    print(json.dumps(fid, indent=1), flush=True)
    items = [(f"{'after' if cal else 'before'}/{p}/seed{s}", p, cal, s, a.num_requests)
             for cal in (False, True) for p in ("vllm", "sarathi") for s in a.seeds]
    results = []
    with ProcessPoolExecutor(a.jobs) as pool:
        for r in pool.map(run_setup, items):
            results.append(r)
            print(f"{r['setup']:24} goodput {r['capacity']['goodput']:.3f} "
                  f"tail {r['capacity']['tail']:.3f}  ({r['simulations']} sims, "
                  f"{r['wall_s']} s)", flush=True)
    summary: dict[str, Any] = {}
    for mode in ("before", "after"):
        for c in CRITERIA:
            cap = {p: float(np.mean([r["capacity"][c] for r in results
                                     if r["setup"].startswith(mode) and r["policy"] == p]))
                   for p in ("vllm", "sarathi")}
            summary[f"{mode}/{c}"] = {**cap, "sarathi_over_vllm": round(
                cap["sarathi"] / cap["vllm"], 3)}
    print(json.dumps(summary, indent=1))
    with open(a.out, "w") as f:
        json.dump({"num_requests": a.num_requests, "seeds": a.seeds, "fidelity": fid,
                   "capacity_mean_over_seeds": summary, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
