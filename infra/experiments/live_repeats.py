"""Issue 14: the live stack's own run-to-run spread, Ascendra 2L1H, against the simulator's.

The live-vs-sim table (``live_vs_sim.py --num-requests 600 --tag fasthost``) set one live
run per load (two runs in all) against the median of 16 simulated noise draws. One live
run of a threshold policy's tail is one sample too. This repeats the live runs of that
table (same workload, seeds and stack: ``batch_overrun.py live 600 QPS``, whose bench is the
same command without ``--compare-sim``) and compares the *median of the live runs* with
the same simulated median, metric by metric, beside each single run's difference.

    PYTHONPATH=shared:services python infra/experiments/live_repeats.py run LOAD [K]
    PYTHONPATH=shared:services python infra/experiments/live_repeats.py table

``run`` adds K (default 4) live runs at LOAD x 9.5 req/s to
``docs/results/live_repeats_fasthost/ascendra-<LOAD>.runN.json``; ``table`` reads them with
the table's two runs and writes ``docs/results/live_repeats_fasthost.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_overrun import CAPACITY, KEYS, live  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "docs/results/live_repeats_fasthost"
TABLE = ROOT / "docs/results/live_vs_sim_n600_replay_fasthost.json"
OUT = ROOT / "docs/results/live_repeats_fasthost.json"
PREDICTOR = "overlap+calibration_profile+refit1s+draws16"  # the table's best, no live input
LOADS = (0.5, 0.7, 0.9)


def run(load: float, k: int) -> None:
    RAW.mkdir(parents=True, exist_ok=True)
    have = len(list(RAW.glob(f"ascendra-{load:g}.run*.json")))
    for n in range(have + 1, have + k + 1):
        res = live(600, load * CAPACITY)
        (RAW / f"ascendra-{load:g}.run{n}.json").write_text(json.dumps(res, indent=1) + "\n")
        print(load, n, res["bench"], flush=True)


def table() -> dict[str, Any]:
    rows = json.loads(TABLE.read_text())["rows"]
    out: dict[str, Any] = {"predictor": PREDICTOR, "loads": {}}
    for load in LOADS:
        mine = [r for r in rows if r["deployment"] == "ascendra" and r["load"] == load]
        sim = {k: v["sim"] for k, v in mine[0]["sim"][PREDICTOR]["metrics"].items()}
        runs = [r["live"] for r in mine]
        runs += [json.loads(p.read_text())["bench"]
                 for p in sorted(RAW.glob(f"ascendra-{load:g}.run*.json"))]
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
        out["loads"][f"{load:g}"] = {"qps": load * CAPACITY, "offloads_live":
                                     [r.get("offloads") for r in runs], "metrics": cells}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(float(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 4)
    else:
        for load, row in table()["loads"].items():
            for key, c in row["metrics"].items():
                print(f"{load} {key}: live median {c['live_median'] * 1e3:.1f} ms "
                      f"({c['live_min'] * 1e3:.1f}-{c['live_max'] * 1e3:.1f}, {c['runs']} runs) "
                      f"sim {c['sim'] * 1e3:.1f} ms: {c['diff_median']:+.1%}; single runs "
                      f"within 5 %: {c['within_5pct_runs']} of {c['runs']}")
