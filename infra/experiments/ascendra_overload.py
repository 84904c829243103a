"""Ascendra §8.6 (the abstract's 1.7x): serving above capacity with late requests dropped.

Paper: 3 A100s (Ascendra 2 LP + 1 HP vs vLLM x3 and Sarathi-Serve x3), Mistral-7B
on ShareGPT, 10 minutes at "an arrival rate slightly above system capacity";
"any request that remains in the waiting queue past the TTFT SLO is dropped"
for every framework. Ascendra "serves 1.74x more request[s] under SLO" and cuts
drops plus SLO violations "by almost 50%" (Fig. 12).

Here: the simulator, llama-3-8b on the A100 profile, ShareGPT, TTFT 1 s /
TBT 0.15 s, Poisson arrivals at ``--qps`` for ``--num-requests`` requests
(default 10 req/s x 6,000 = 10 minutes). Every policy drops waiting requests
past their TTFT deadline: Ascendra with its own ``drop_late``, the baselines
through ``policies.drop_late.with_drop_late``. Writes one JSON object to
``--out`` with the paper's figures, ours and the setup.

    python infra/experiments/ascendra_overload.py [--qps 10] [--num-requests 6000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sloserve.policies.ascendra import AscendraConfig
from sloserve.policies.drop_late import with_drop_late
from sloserve.policies.registry import PolicySpec, get_spec, register
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

PAPER = {"served_under_slo_ratio": 1.74, "drops_plus_violations_reduction": 0.5,
         "source": "Ascendra §8.6, Fig. 12 (abstract: up to 1.7x)"}
BASELINES = ("vllm", "sarathi")


def drop_late_name(policy: str) -> str:
    """The registered drop-late variant of ``policy`` (registered on first use)."""
    name = f"{policy}+drop-late"
    try:
        get_spec(name)
    except ValueError:
        spec = get_spec(policy)
        register(PolicySpec(name, spec.config_cls,
                            {r: with_drop_late(c) for r, c in spec.roles.items()}))
    return name


def deployments() -> list[tuple[str, SimConfig]]:
    """(label, config) per framework; every one drops late requests (§8.6)."""
    asc = SimConfig(policy="ascendra", instances=3, hp_instances=1,
                    policy_config=AscendraConfig(drop_late=True))
    return [("ascendra-2L1H", asc),
            *((f"{b}x3", SimConfig(policy=drop_late_name(b), instances=3)) for b in BASELINES)]


def run(label: str, cfg: SimConfig, qps: float, num_requests: int, seed: int) -> dict[str, Any]:
    cfg = dataclasses.replace(cfg, qps=qps, num_requests=num_requests, seed=seed)
    out = simulate(cfg)
    n, good, dropped = out["requests"], out["good"], out["dropped"]
    return {"policy": label,
            "requests": n, "served_under_slo": good, "dropped": dropped,
            "violated": n - good - dropped, "goodput_share": out["goodput_share"],
            "offloads": out["offloads"], "ttft_p99": out["ttft_p99"],
            "mean_tbt_p99": out["mean_tbt_p99"], "sim_time_s": out["sim_time_s"]}


def missed(row: dict[str, Any]) -> int:
    """Requests not served under SLO: dropped plus completed late (Fig. 12's two bars)."""
    return int(row["dropped"]) + int(row["violated"])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--qps", type=float, default=10.0,
                    help="arrival rate for all 3 GPUs (default 10: above every policy's "
                         "90%%-goodput capacity at 9 req/s, see docs/ascendra.md)")
    ap.add_argument("--num-requests", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/ascendra_overload.json")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [run(label, cfg, a.qps, a.num_requests, a.seed) for label, cfg in deployments()]
    asc, base = rows[0], rows[1:]
    best = max(base, key=lambda r: r["served_under_slo"])
    result = {
        "experiment": "ascendra-overload",
        "paper": PAPER,
        "ours": {
            "served_under_slo_ratio_vs_best_baseline":
                asc["served_under_slo"] / max(best["served_under_slo"], 1),
            **{f"served_under_slo_ratio_vs_{r['policy']}":
               asc["served_under_slo"] / max(r["served_under_slo"], 1) for r in base},
            "drops_plus_violations_reduction_vs_best_baseline":
                1.0 - missed(asc) / max(missed(best), 1),
        },
        "setup": {"model": "llama-3-8b", "gpu": "a100", "trace": "sharegpt", "qps": a.qps,
                  "num_requests": a.num_requests, "seed": a.seed, "ttft_slo": 1.0,
                  "tbt_slo": 0.15, "gpus": 3, "drop": "waiting past TTFT deadline, all",
                  "paper_setup": "Mistral-7B, 3 x A100-80G, real runs, 10 min"},
        "rows": rows,
        "command": "python infra/experiments/ascendra_overload.py "
                   f"--qps {a.qps} --num-requests {a.num_requests} --seed {a.seed}",
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main()["ours"], indent=1))
