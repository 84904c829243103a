"""Wall time of a sweep with 2 local Ray workers against 1 (issue 37: >= 1.7x on 2 cores).

Runs ``sloserve sweep SPEC --workers N`` as a subprocess into a fresh table for each N in
``--order`` (default ``1,2,2,1``: alternated, ABBA), and prints per run: the command's wall
time (Ray start-up included), the sweep's own wall time (first task submitted to last row
written, Ray start-up excluded), the cells' summed CPU and wall seconds (each cell's
``cpu_s``/``wall_s`` from its row: the work, and how long it took under the load), the
cores the cells had on average (summed CPU / sweep wall: 1 and 2 on an idle machine), and
the 1-minute load average before and after. Cells go longest first by the ``cpu_s`` of the
spec's checked-in table (``--costs``), or in the spec's order with ``--spec-order``. Then
the ratios 1-worker / 2-worker (medians of the runs), and, with ``--check``, each cell's
capacity against ``sloserve capacity`` with the cell's own command line (run after the
timed runs, in this process).

    PYTHONPATH=shared:services nice -n 10 python infra/bench/sweep_speedup.py --check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "infra/sweeps/capacity16.yaml"
CLI = "from sloserve.services.cli import main; raise SystemExit(main())"


def load1() -> float:
    return os.getloadavg()[0]


def children_cpu() -> float:
    """User + system CPU of this process's reaped descendants: the ``sloserve sweep``
    process and those of its Ray processes it reaps (measured: not the workers)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one_run(spec: Path, workers: int, table: Path, costs: Path | None) -> dict[str, Any]:
    """One ``sloserve sweep`` into ``table`` (``--costs`` when given): its figures."""
    la0, t0, ru0 = load1(), time.perf_counter(), children_cpu()
    extra = [] if costs is None else ["--costs", str(costs)]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CLI,
            "sweep",
            str(spec),
            "--workers",
            str(workers),
            "--results",
            str(table),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    wall, session_cpu = time.perf_counter() - t0, children_cpu() - ru0
    if proc.returncode != 0:  # e.g. Ray's start timed out on an overloaded machine
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {
            "workers": workers,
            "error": f"exit {proc.returncode}: {err}"[-300:],
            "command_wall_s": round(wall, 2),
            "load1_before": round(la0, 2),
            "load1_after": round(load1(), 2),
        }
    m = re.search(r"node\(s\), ([\d.]+)s", proc.stdout)
    rows = [json.loads(line) for line in table.read_text().splitlines() if line.strip()]
    sweep_wall = float(m.group(1)) if m else None
    cpu = sum(r["cpu_s"] for r in rows)
    return {
        "workers": workers,
        "cells": len(rows),
        "command_wall_s": round(wall, 2),
        "sweep_wall_s": sweep_wall,
        "cells_cpu_s": round(cpu, 2),
        # cores the cells had on average: the speedup's ceiling under this load
        "cores_used": round(cpu / sweep_wall, 3) if sweep_wall else None,
        # the driver and what it reaps (Ray's own processes; the workers are not)
        "driver_side_cpu_s": round(session_cpu, 2),
        "cells_wall_s": round(sum(r["wall_s"] for r in rows), 2),
        "pids": len({r["pid"] for r in rows}),
        "load1_before": round(la0, 2),
        "load1_after": round(load1(), 2),
        "capacities": {r["cell"]: r["result"]["capacity_qps"] for r in rows},
        "commands": {r["cell"]: r["command"] for r in rows},
    }


def check_capacity(commands: dict[str, str], caps: dict[str, float]) -> list[str]:
    """Cells whose capacity differs from ``sloserve capacity``'s on the same command."""
    from sloserve.services.sim_cmd import config_from_args
    from sloserve.services.sweep.spec import _parsers
    from sloserve.sim.capacity import find_capacity

    parser = _parsers()["capacity"]
    bad = []
    for cell, line in commands.items():
        argv = shlex.split(line.split("  #", 1)[0])[2:]  # drop "sloserve capacity"
        ns = parser.parse_args(argv)
        out = find_capacity(
            config_from_args(ns, 1.0), ns.criterion, ns.target, qps_start=ns.qps_start
        )
        if out["capacity_qps"] != caps[cell]:
            bad.append(f"{cell}: sweep {caps[cell]} vs capacity {out['capacity_qps']}")
    return bad


def summarize(runs: list[dict[str, Any]], order: list[int]) -> dict[str, Any]:
    """Whether every run found the same capacities, and the 1- vs 2-worker ratios."""
    caps = [r["capacities"] for r in runs]
    same = all(c == caps[0] for c in caps)
    summary: dict[str, Any] = {"same_capacities_every_run": same}
    by = {w: [r for r in runs if r["workers"] == w] for w in sorted(set(order))}
    by = {w: rs for w, rs in by.items() if rs}
    if 1 in by and 2 in by:
        for key in (
            "command_wall_s",
            "sweep_wall_s",
            "cells_cpu_s",
            "driver_side_cpu_s",
            "cores_used",
        ):
            one = statistics.median(r[key] or 0.0 for r in by[1])
            two = statistics.median(r[key] or 0.0 for r in by[2])
            summary[key] = {"1": one, "2": two, "ratio": round(one / two, 3) if two else None}
        summary["per_run_ratio_command"] = [
            round(x["command_wall_s"] / y["command_wall_s"], 3) for x, y in zip(by[1], by[2])
        ]
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--order", default="1,2,2,1", help="worker counts, in run order")
    ap.add_argument(
        "--spec-order",
        action="store_true",
        help="submit in the spec's order (default: longest first by the cpu_s of the "
        "spec's checked-in table, `sloserve sweep --costs`)",
    )
    ap.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="write the runs' tables here (default: a temporary folder)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="also compare each cell's capacity with `sloserve capacity`'s",
    )
    a = ap.parse_args(argv)
    order = [int(x) for x in a.order.split(",") if x]
    if not order or any(w < 1 for w in order):
        ap.error(f"--order: worker counts >= 1, got {a.order!r}")
    checked_in = a.spec.with_name(a.spec.stem + ".results.jsonl")
    costs = None if a.spec_order or not checked_in.exists() else checked_in
    print(json.dumps({"spec": str(a.spec), "costs": str(costs), "order": order}), flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="sweep-speedup-") as tmp_dir:
        tmp = a.keep or tmp_dir
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for i, w in enumerate(order):
            r = one_run(a.spec, w, Path(tmp) / f"run{i}-w{w}.jsonl", costs)
            print(
                json.dumps({k: v for k, v in r.items() if k not in ("capacities", "commands")}),
                flush=True,
            )
            runs.append(r)
    failed = [r for r in runs if "error" in r]
    runs = [r for r in runs if "error" not in r]
    if not runs:
        raise SystemExit("every run failed")
    summary = summarize(runs, order)
    summary["failed_runs"] = len(failed)
    if a.check:
        bad = check_capacity(runs[0]["commands"], runs[0]["capacities"])
        summary["capacity_check"] = "same as sloserve capacity, cell by cell" if not bad else bad
    summary["load1_now"] = round(load1(), 2)
    print(json.dumps(summary), flush=True)
    return (
        0
        if summary["same_capacities_every_run"]
        and not isinstance(summary.get("capacity_check"), list)
        else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
