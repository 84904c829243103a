"""Issue 13 items 2-3: capacity of ``slack`` vs the best seed policy, and the goodput bound.

Usage: python infra/experiments/beyond_capacity.py [--num-requests K] [--jobs J]
       [--only SUBSTR] [--traces a,b] [--instances 1,3] [--slos tbt0.1,tbt0.5,hetero]
       [--seeds vllm,sarathi,...] [--qps-max-factor F] [--out FILE.json]

Grid (llama-3-8b on a100): traces x instances x SLOs x policies. SLOs: uniform
TTFT 1 s with TBT 0.1 s or 0.5 s, or AccelGen's heterogeneous mix. Seeds: every
registered policy but ``slack`` (``ascendra`` only at >= 2 instances, with its
default HP share); ``oracle`` is the SRPT seed, not the bound. Ours runs twice:
``slack`` (defaults, shedding on) and ``slack-noshed`` (``shed=False``), because
the ``tail`` criterion ignores dropped requests, so shedding alone passes it at
any rate; ours' tail is judged on ``slack-noshed``. Each setup's probes are shared
by the three criteria. Per cell the bound is ``sloserve.sim.bound``. The JSON is
rewritten after every finished setup, so a cut-short run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from sloserve.perf.ground_truth import ProfileTiming
from sloserve.perf.models import get_model
from sloserve.policies import get_spec, policy_names
from sloserve.policies.slack import SlackConfig
from sloserve.sim.bound import goodput_bound
from sloserve.sim.capacity import find_capacity
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import build_timing, build_workload

CRITERIA = ("goodput", "tail", "token")
OURS = "slack"
NOSHED = "slack-noshed"
TRACES = ("sharegpt", "arxiv", "azure-conv", "azure-code")
SLOS: dict[str, dict[str, Any]] = {
    "tbt0.1": {"ttft_slo": 1.0, "tbt_slo": 0.1},
    "tbt0.5": {"ttft_slo": 1.0, "tbt_slo": 0.5},
    "hetero": {"ttft_slo": None, "tbt_slo": 0.1875, "slo_mix": "hetero"},
}


def cell_name(trace: str, instances: int, slo: str) -> str:
    return f"{trace}/x{instances}/{slo}"


def setups(k: int, traces: list[str], instances: list[int], slos: list[str],
           seeds: list[str]) -> list[tuple[str, str, SimConfig]]:
    out = []
    for trace in traces:
        for n in instances:
            for slo in slos:
                for label in [OURS, NOSHED, *seeds]:
                    p = OURS if label == NOSHED else label
                    hp = get_spec(p).default_hp(n)
                    if get_spec(p).has_role("hp") and hp == 0:
                        continue  # Ascendra needs an HP instance
                    pc = SlackConfig(shed=False) if label == NOSHED else None
                    cfg = SimConfig(policy=p, trace=trace, instances=n, hp_instances=hp,
                                    num_requests=k, policy_config=pc, **SLOS[slo])
                    out.append((cell_name(trace, n, slo), label, cfg))
    return out


def run_setup(item: tuple[str, str, SimConfig], qps_max_factor: float = 64.0
              ) -> dict[str, Any]:
    cell, policy, cfg = item
    t0 = time.time()
    cache: dict[float, dict[str, Any]] = {}
    start = 1.0 * cfg.instances
    res = {c: find_capacity(cfg, c, 0.9, qps_start=start, qps_max=qps_max_factor * start,
                            cache=cache)
           for c in CRITERIA}
    return {"cell": cell, "policy": policy,
            "capacity": {c: r["capacity_qps"] for c, r in res.items()},
            "at_limit": {c: r["at_search_limit"] for c, r in res.items()},
            "probes": {c: r["probes"] for c, r in res.items()},
            "simulations": len(cache), "wall_s": round(time.time() - t0, 1)}


def bound_for(cfg: SimConfig) -> dict[str, Any]:
    """The goodput bound on the workload ``cfg`` simulates (its rate does not matter)."""
    requests = build_workload(cfg, get_model(cfg.model), build_timing(cfg)).requests
    floor = ProfileTiming(cfg.model, cfg.gpu, noise_cv=0.0, tp=cfg.tp)
    return goodput_bound(requests, floor, instances=cfg.instances)


def summarise(results: list[dict[str, Any]], bounds: dict[str, dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """Per cell and criterion: ours, the best seed (and which), their ratio; goodput vs bound."""
    rows = []
    for cell in dict.fromkeys(r["cell"] for r in results):
        mine = [r for r in results if r["cell"] == cell and r["policy"] == OURS]
        noshed = [r for r in results if r["cell"] == cell and r["policy"] == NOSHED]
        seeds = [r for r in results if r["cell"] == cell and r["policy"] not in (OURS, NOSHED)]
        if not mine or not seeds:
            continue
        row: dict[str, Any] = {"cell": cell, "bound_goodput_qps": bounds[cell]["capacity_qps"],
                               "bound": bounds[cell]}
        for c in CRITERIA:
            best = max(seeds, key=lambda r: r["capacity"][c])
            ours, top = mine[0]["capacity"][c], best["capacity"][c]
            row[c] = {"ours": ours, "best_seed": top, "best_seed_policy": best["policy"],
                      "ratio": round(ours / top, 3) if top else None,
                      "ours_at_limit": mine[0]["at_limit"][c],
                      "seed_at_limit": best["at_limit"][c]}
            if noshed:
                row[c]["ours_noshed"] = noshed[0]["capacity"][c]
                row[c]["ours_noshed_at_limit"] = noshed[0]["at_limit"][c]
                row[c]["noshed_ratio"] = round(noshed[0]["capacity"][c] / top, 3) if top else None
        b = bounds[cell]["capacity_qps"]
        row["goodput"]["ours_over_bound"] = round(row["goodput"]["ours"] / b, 3) if b else None
        row["goodput"]["seed_over_bound"] = round(row["goodput"]["best_seed"] / b, 3) if b else None
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="substring filter on 'cell/policy'")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--instances", default="1,3")
    ap.add_argument("--slos", default=",".join(SLOS))
    ap.add_argument("--seeds", default="", help="seed policies (default: all but slack)")
    ap.add_argument("--qps-max-factor", type=float, default=64.0,
                    help="stop doubling at this x the start rate (1 req/s per instance)")
    ap.add_argument("--out", default="docs/results/beyond_capacity.json")
    a = ap.parse_args(argv)
    seeds = a.seeds.split(",") if a.seeds else [p for p in policy_names() if p != OURS]
    argv_used = sys.argv[1:] if argv is None else argv
    for name in a.slos.split(","):
        if name not in SLOS:
            raise SystemExit(f"--slos: unknown {name!r}; choose from {', '.join(SLOS)}")
    items = [s for s in setups(a.num_requests, a.traces.split(","),
                               [int(x) for x in a.instances.split(",")], a.slos.split(","), seeds)
             if a.only in f"{s[0]}/{s[1]}"]
    t0 = time.time()
    bounds = {cell: bound_for(cfg) for cell, _, cfg in {i[0]: i for i in items}.values()}
    results: list[dict[str, Any]] = []

    def dump(rows: list[dict[str, Any]]) -> None:
        with open(a.out, "w") as f:
            json.dump({"argv": argv_used, "num_requests": a.num_requests, "seeds": seeds,
                       "wall_s": round(time.time() - t0, 1), "cells": rows,
                       "bounds": bounds, "results": results}, f, indent=1)

    def done(r: dict[str, Any]) -> None:
        results.append(r)
        c, lim = r["capacity"], r["at_limit"]
        cells = " ".join(f"{'>=' if lim[k] else ''}{c[k]:.3f}" for k in CRITERIA)
        print(f"{r['cell']:28} {r['policy']:13} {cells}  sims={r['simulations']} "
              f"wall={r['wall_s']}", flush=True)
        dump(summarise(results, bounds))

    if a.jobs <= 1:  # in-process (also when loaded by path, where workers cannot import it)
        for i in items:
            done(run_setup(i, a.qps_max_factor))
    else:
        with ProcessPoolExecutor(a.jobs) as pool:
            futures = [pool.submit(run_setup, i, a.qps_max_factor) for i in items]
            for fut in as_completed(futures):
                done(fut.result())
    rows = summarise(results, bounds)
    for row in rows:
        g, t = row["goodput"], row["tail"]
        print(f"{row['cell']:28} goodput {g['ours']:.3f} vs {g['best_seed']:.3f} "
              f"({g['best_seed_policy']}) x{g['ratio']}  tail {t['ours']:.3f} vs "
              f"{t['best_seed']:.3f} ({t['best_seed_policy']}) noshed {t.get('ours_noshed')}  "
              f"bound {row['bound_goodput_qps']:.3f}"
              f" ours/bound {g['ours_over_bound']}", flush=True)
    dump(rows)


if __name__ == "__main__":
    main()
