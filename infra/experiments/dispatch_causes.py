"""Where Ascendra 2L1H's arrivals go, live vs simulated: route, ticket (to the HP) and offload.

A diagnostic for issue 14's open Ascendra cell (docs/lab/live-stack.md, "The perf model's
refit clock"): the live LP instances offload more than the simulation. For each load it
runs one live stack (`up`-equivalent, real Redis, the gateway's decision log on) with the
workload of ``live_vs_sim.py --num-requests 600`` (ShareGPT, seed 4, capacity 9.5 req/s),
counts the gateway's dispatches by cause and saves the run's overhead profile
(``bench --overhead-out``: un-hidden gaps and the gateway's delivery lags). Then it
simulates the same run (overlap, admission, refit every 1 s, noise seeds 0-3, seed 0 being
the executors' own draws) recording the controller's decisions, three ways: no profile;
the run's own profile; the run's own profile with ``--controller-lag`` (the instances'
reports reach the controller after the measured delivery lag).

    PYTHONPATH=shared:services python infra/experiments/dispatch_causes.py [LOAD ...]

Writes ``docs/results/ascendra_dispatch_causes_<host>.json`` (host: ``avx512`` or ``avx2``).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sloserve.admission import Admission
from sloserve.services.auth import new_token
from sloserve.services.stack import Stack, StackConfig
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = 9.5  # live_vs_sim_n600_replay_fasthost.json: capacity_qps.ascendra
WORKLOAD = ["--trace", "sharegpt", "--num-requests", "600", "--seed", "4"]


def live(qps: float, profile: Path) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix="dispatch-causes-"))
    os.environ["SLOSERVE_INTERNAL_TOKEN"] = new_token()  # the stack's and bench's
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT / 'services'}")
    cfg = StackConfig(policy="ascendra", instances=3, hp_instances=1, seed=0,
                      gateway_port=21000 + os.getpid() % 1000,
                      redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                      log_dir=d / "logs", decision_dir=d)
    load_before = os.getloadavg()
    with Stack(cfg) as stack:
        r = subprocess.run([sys.executable, "-m", "sloserve.services.cli", "bench", "--target",
                            stack.gateway, *WORKLOAD, "--qps", f"{qps:.4f}", "--json",
                            "--disable-tqdm", "--compare-sim", "--overhead-out", str(profile)],
                           capture_output=True, text=True, env=env)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"bench failed ({r.returncode}): {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    causes: collections.Counter[str] = collections.Counter()
    for line in (d / "gateway.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "dispatch":
            causes[rec["cause"]] += 1
    cmp = out["compare_sim"]
    return {"causes": dict(causes), "offloads": out["offloads"], "ttft_p99": out["ttft_p99"],
            "arrival_lag_p99_ms": cmp.get("arrival_lag_p99_ms"),
            "delivery_lag_p50_ms": cmp.get("delivery_lag_p50_ms"),
            "delivery_lag_p99_ms": cmp.get("delivery_lag_p99_ms"),
            "load_avg_before": load_before, "load_avg_after": os.getloadavg()}


def simulated(qps: float, profile: str | None, lag: bool) -> dict[str, Any]:
    """Per noise seed 0-3: dispatches by cause, offloads, TTFT P99."""
    rows: dict[str, list[Any]] = {"ticket": [], "route": [], "offloads": [], "ttft_p99": []}
    for seed in range(4):
        sim = Simulation(SimConfig(
            policy="ascendra", instances=3, hp_instances=1, trace="sharegpt",
            num_requests=600, seed=4, qps=round(qps, 4), admission=Admission(), overlap=True,
            noise_streams="instance", noise_seed=seed, refit_interval=1.0,
            record_decisions=True, overhead_profile=profile, controller_lag=lag))
        out = sim.run()
        assert sim.controller.decisions is not None
        causes = collections.Counter(getattr(a, "cause", "drop")
                                     for a in sim.controller.decisions)
        for key in ("ticket", "route"):
            rows[key].append(causes[key])
        rows["offloads"].append(out["offloads"])
        rows["ttft_p99"].append(out["ttft_p99"])
    return rows


def main() -> None:
    loads = [float(x) for x in sys.argv[1:]] or [0.5, 0.7, 0.9]
    host = "avx512" if "avx512f" in Path("/proc/cpuinfo").read_text() else "avx2"
    rows = []
    for load in loads:
        qps = load * CAPACITY
        profile = Path(tempfile.mkdtemp(prefix="dispatch-profile-")) / "profile.json"
        row = {"load": load, "qps": qps, "live": live(qps, profile),
               "sim": simulated(qps, None, False),
               "sim_own_profile": simulated(qps, str(profile), False),
               "sim_own_profile_controller_lag": simulated(qps, str(profile), True)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    path = ROOT / "docs" / "results" / f"ascendra_dispatch_causes_{host}.json"
    path.write_text(json.dumps({"host": host, "cpu_count": os.cpu_count(), "rows": rows},
                               indent=1) + "\n")


if __name__ == "__main__":
    main()
