"""Issue 13: where the heterogeneous goodput bar (1.2 x the best seed's share at every rate)
is beyond any scheduler, with the ground truth's noise counted.

Usage: python infra/experiments/hetero_cap.py GRID.json [GRID.json ...] --out OUT.json

For each heterogeneous cell of each ``beyond_capacity.py`` file, ``feasible_alone`` (the
cell's workload, the file's request count and workload seed) gives the feasible share on
the noiseless ground truth, ``expected_share`` (each request's chance of making its SLOs
alone in one noisy draw, averaged: no scheduler's share can be higher in expectation) and
``share_p999`` (that plus 3.1 standard deviations of the count: what a lucky draw might
reach). Per rate the bar is compared with both; a cell is ``beyond_expected`` if the bar
is above ``expected_share`` at some rate, ``beyond_p999`` if above ``share_p999``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sloserve.sim.config import SimConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
import beyond_capacity as bc  # noqa: E402

BAR = 1.2


def cell_caps(grid: dict[str, Any]) -> list[dict[str, Any]]:
    """Each heterogeneous cell: its feasible shares and, per rate, the bar against them."""
    seed, out = bc.grid_args(grid).seed, []
    for row in grid["cells"]:
        if "goodput_fixed" not in row:
            continue
        trace, inst, slo = row["cell"].split("/")
        n = int(inst.removeprefix("x"))
        cfg = SimConfig(policy="vllm", trace=trace, instances=n, qps=1.0 * n,
                        num_requests=grid["num_requests"], seed=seed, **bc.SLOS[slo])
        cap = bc.feasible_alone(cfg)
        rates = {q: {"bar": round(BAR * v["best_seed"], 4), "ours": v["ours"],
                     "best_seed": v["best_seed"]}
                 for q, v in row["goodput_fixed"].items()}
        out.append({"cell": row["cell"], **cap, "rates": rates,
                    "beyond_noiseless": any(r["bar"] > cap["share"] for r in rates.values()),
                    "beyond_expected": any(r["bar"] > cap["expected_share"]
                                           for r in rates.values()),
                    "beyond_p999": any(r["bar"] > cap["share_p999"] for r in rates.values())})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grids", nargs="+", help="beyond_capacity.py output files")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    files = {}
    for path in a.grids:
        try:
            with open(path) as f:
                grid = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise SystemExit(f"hetero_cap: {path}: {exc}") from None
        if not {"cells", "argv", "num_requests"} <= grid.keys():
            raise SystemExit(f"hetero_cap: {path}: not a beyond_capacity.py file "
                             "(no 'cells', 'argv' or 'num_requests')")
        cells = cell_caps(grid)
        files[path] = {"num_requests": grid["num_requests"], "seed": bc.grid_args(grid).seed,
                       "cells": cells,
                       **{k: sum(c[k] for c in cells)
                          for k in ("beyond_noiseless", "beyond_expected", "beyond_p999")}}
        print(f"{path}: {len(cells)} heterogeneous cells; bar above the noiseless feasible "
              f"share in {files[path]['beyond_noiseless']}, above the expected share in "
              f"{files[path]['beyond_expected']}, above a 99.9 % lucky draw in "
              f"{files[path]['beyond_p999']}", flush=True)
        for c in cells:
            bars = " ".join(f"@{q}:{r['bar']:.3f}" for q, r in c["rates"].items())
            print(f"  {c['cell']:20} noiseless {c['share']:.3f} expected "
                  f"{c['expected_share']:.3f} p99.9 {c['share_p999']:.3f} | bar {bars}",
                  flush=True)
    with open(a.out, "w") as f:
        json.dump({"bar": BAR, "files": files}, f, indent=1)


if __name__ == "__main__":
    main()
