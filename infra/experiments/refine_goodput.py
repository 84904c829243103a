"""Issue 13: the uniform cells' goodput capacities of a ``beyond_capacity.py`` file, bisected
further, to a finer relative step.

Usage: python infra/experiments/refine_goodput.py GRID.json [--rel-tol 0.01] [--only SUBSTR]
       [--jobs J] --out OUT.json

``beyond_capacity.py`` bisects each capacity until the bracket is within 5 % (its
``find_capacity`` default), so a ratio of two capacities is known to about ±5 %, and
"1.19 against a bar of 1.2" is inside that. This reruns the same search
(``find_capacity``, same start, same doubling limit, same target) with ``--rel-tol``,
for every policy of every uniform cell, its cache filled from the file's probes: the
bisection retraces the old path with no new simulation and then goes on from the old
bracket. The heterogeneous cells (goodput at fixed rates, nothing searched) and a
capacity at the search limit are kept as they are. The output is the input with those
goodput capacities (and their new probes) replaced and the cells re-summarised, so
``beyond_report.py`` reads it as any grid; each result also says ``goodput_rel_tol``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sloserve.sim.capacity import find_capacity
from sloserve.sim.config import SimConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
import beyond_capacity as bc  # noqa: E402


def setup_configs(grid: dict[str, Any]) -> dict[tuple[str, str], SimConfig]:
    """(cell, policy) -> the SimConfig ``beyond_capacity.py`` ran, rebuilt from the file's
    command line (workload seed, request count, ours' knob flags)."""
    a = bc.grid_args(grid)
    if a.num_requests != grid["num_requests"]:
        raise SystemExit("refine_goodput: the file's argv and num_requests disagree")
    policies = sorted({r["policy"] for r in grid["results"]})
    seeds = [p for p in policies if p != bc.OURS and p not in bc.REFS
             and not p.startswith(f"{bc.OURS}-")]
    refs = [p for p in policies if p in bc.REFS]
    traces = list(dict.fromkeys(r["cell"].split("/")[0] for r in grid["results"]))
    items = bc.setups(grid["num_requests"], traces, [1, 3], list(bc.SLOS), seeds, refs,
                      None, bc.ours_config(a), a.seed)
    return {(cell, policy): cfg for cell, policy, cfg in items}


def refine(result: dict[str, Any], cfg: SimConfig, rel_tol: float) -> dict[str, Any]:
    """``result`` with its goodput capacity bisected to ``rel_tol`` (probes kept)."""
    cache = {float(q): dict(p) for q, p in result["probes"].items()}
    before = len(cache)
    t0 = time.time()
    start = 1.0 * cfg.instances
    found = find_capacity(cfg, "goodput", result["goodput_target"], qps_start=start,
                          qps_max=result["_qps_max"], rel_tol=rel_tol, max_probes=30,
                          cache=cache)
    out = {k: v for k, v in result.items() if k != "_qps_max"}
    out["capacity"] = {**result["capacity"], "goodput": found["capacity_qps"]}
    out["at_limit"] = {**result["at_limit"], "goodput": found["at_search_limit"]}
    out["probes"] = {str(q): {k: s.get(k) for k in bc.PROBE_KEYS}
                     for q, s in sorted(cache.items())}
    out["goodput_rel_tol"] = rel_tol
    out["goodput_coarse"] = result["capacity"]["goodput"]
    out["simulations"] = result["simulations"] + len(cache) - before
    out["refine_wall_s"] = round(time.time() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid", help="a beyond_capacity.py output file")
    ap.add_argument("--rel-tol", type=float, default=0.01)
    ap.add_argument("--only", default="", help="substring filter on 'cell/policy'")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if not 0 < a.rel_tol < 0.05:
        raise SystemExit(f"--rel-tol: must be in (0, 0.05), got {a.rel_tol}")
    try:
        with open(a.grid) as f:
            grid = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"refine_goodput: {a.grid}: {exc}") from None
    if "results" not in grid or "argv" not in grid:
        raise SystemExit(f"refine_goodput: {a.grid}: not a beyond_capacity.py file "
                         "(no 'results' or 'argv')")
    configs = setup_configs(grid)
    factor = bc.grid_args(grid).qps_max_factor
    todo = []
    for i, r in enumerate(grid["results"]):
        key = (r["cell"], r["policy"])
        if (r["fixed_rates"] or r["at_limit"]["goodput"] or a.only not in "/".join(key)
                or key not in configs):
            continue
        cfg = configs[key]
        todo.append((i, {**r, "_qps_max": factor * cfg.instances}, cfg))
    t0 = time.time()
    results = list(grid["results"])

    def done(i: int, r: dict[str, Any]) -> None:
        results[i] = r
        added = r["simulations"] - grid["results"][i]["simulations"]
        print(f"{r['cell']:28} {r['policy']:10} goodput {r['goodput_coarse']} -> "
              f"{r['capacity']['goodput']} (+{added} sims, {r['refine_wall_s']} s)", flush=True)

    if a.jobs <= 1:  # in-process (also when loaded by path, where workers cannot import it)
        for i, r, cfg in todo:
            done(i, refine(r, cfg, a.rel_tol))
    else:
        with ProcessPoolExecutor(a.jobs) as pool:
            futs = [(i, pool.submit(refine, r, cfg, a.rel_tol)) for i, r, cfg in todo]
            for i, fut in futs:
                done(i, fut.result())
    cells = bc.summarise(results, grid["bounds"], grid.get("refs", list(bc.REFS)))
    for row in cells:
        if "goodput_fixed" not in row:
            g = row["goodput"]
            print(f"{row['cell']:28} ours {g['ours']} best {g['best_seed']} "
                  f"({g['best_seed_policy']}) x{g['ratio']}", flush=True)
    with open(a.out, "w") as f:
        json.dump({**grid, "cells": cells, "results": results,
                   "refined_from": a.grid, "refine_argv": sys.argv[1:] if argv is None else argv,
                   "refine_rel_tol": a.rel_tol, "refine_wall_s": round(time.time() - t0, 1)},
                  f, indent=1)


if __name__ == "__main__":
    main()
