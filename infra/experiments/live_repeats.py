"""Issue 14: the live stack's own run-to-run spread against the simulator's.

The live-vs-sim table (``live_vs_sim.py --num-requests 600 --tag fasthost``) set one live
run per load (two runs in all) against the median of 16 simulated noise draws. One live
run of a threshold policy's tail is one sample too. This repeats the live runs of that
table (same workload, seeds and stack: ``batch_overrun.py live 600 QPS``, whose bench is the
same command without ``--compare-sim``) and compares the *median of the live runs* with
the same simulated median, metric by metric, beside each single run's difference.

    PYTHONPATH=shared:services python infra/experiments/live_repeats.py run DEP LOAD [K]
    PYTHONPATH=shared:services python infra/experiments/live_repeats.py table

DEP is ``ascendra`` (2L1H, capacity 9.5 req/s, against the fast-host table's best predictor)
or ``sarathi`` (one instance, 1.9375 req/s, against the 600-request replay table's overlap
simulation, the one that met the bar there). ``run`` adds K (default 4) live runs at LOAD x
capacity to ``docs/results/live_repeats_fasthost/<DEP>-<LOAD>.runN.json``; ``table`` reads
them with the tables' own live runs and writes ``docs/results/live_repeats_fasthost.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_overrun import KEYS, live  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "docs/results/live_repeats_fasthost"
OUT = ROOT / "docs/results/live_repeats_fasthost.json"
# deployment: (instances, HP instances, capacity req/s, the live-vs-sim table, its predictor)
DEPLOYMENTS: dict[str, tuple[int, int, float, str, str]] = {
    "ascendra": (3, 1, 9.5, "live_vs_sim_n600_replay_fasthost.json",
                 "overlap+calibration_profile+refit1s+draws16"),  # the best with no live input
    "sarathi": (1, 0, 1.9375, "live_vs_sim_n600_replay.json", "overlap"),
}
LOADS = (0.5, 0.7, 0.9)


def run(dep: str, load: float, k: int) -> None:
    instances, hp, capacity, _, _ = DEPLOYMENTS[dep]
    RAW.mkdir(parents=True, exist_ok=True)
    have = len(list(RAW.glob(f"{dep}-{load:g}.run*.json")))
    for n in range(have + 1, have + k + 1):
        res = live(600, load * capacity, dep, instances, hp)
        (RAW / f"{dep}-{load:g}.run{n}.json").write_text(json.dumps(res, indent=1) + "\n")
        print(dep, load, n, res["bench"], flush=True)


def table() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dep, (_, _, capacity, source, predictor) in DEPLOYMENTS.items():
        out[dep] = {"table": source, "predictor": predictor, "loads": cells_of(
            dep, capacity, json.loads((ROOT / "docs/results" / source).read_text())["rows"],
            predictor)}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    return out


def cells_of(dep: str, capacity: float, rows: list[dict[str, Any]], predictor: str
             ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for load in LOADS:
        mine = [r for r in rows if r["deployment"] == dep and r["load"] == load]
        sim = {k: v["sim"] for k, v in mine[0]["sim"][predictor]["metrics"].items()}
        runs = [r["live"] for r in mine]
        runs += [json.loads(p.read_text())["bench"]
                 for p in sorted(RAW.glob(f"{dep}-{load:g}.run*.json"))]
        cells = {}
        for key in KEYS:
            values = [r[key] for r in runs]
            med = statistics.median(values)
            cells[key] = {"sim": sim[key], "live_median": med, "live_min": min(values),
                          "live_max": max(values), "runs": len(values),
                          "diff_median": med / sim[key] - 1,
                          "diff_runs": [v / sim[key] - 1 for v in values],
                          "within_5pct_runs": sum(abs(v / sim[key] - 1) <= 0.05
                                                  for v in values)}
        out[f"{load:g}"] = {"qps": load * capacity, "offloads_live":
                            [r.get("offloads") for r in runs], "metrics": cells}
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    if not (args[:1] == ["table"] and len(args) == 1 or args[:1] == ["run"]
            and 3 <= len(args) <= 4 and args[1] in DEPLOYMENTS):
        raise SystemExit(f"usage: live_repeats.py run DEP LOAD [K] | table "
                         f"(DEP one of {', '.join(DEPLOYMENTS)}); got {args}")
    if args[0] == "run":
        run(args[1], float(args[2]), int(args[3]) if len(args) > 3 else 4)
    else:
        for dep, t in table().items():
            for load, row in t["loads"].items():
                for key, c in row["metrics"].items():
                    print(f"{dep} {load} {key}: live median {c['live_median'] * 1e3:.1f} ms "
                          f"({c['live_min'] * 1e3:.1f}-{c['live_max'] * 1e3:.1f}, "
                          f"{c['runs']} runs) sim {c['sim'] * 1e3:.1f} ms: "
                          f"{c['diff_median']:+.1%}; single runs within 5 %: "
                          f"{c['within_5pct_runs']} of {c['runs']}")
