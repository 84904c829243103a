"""Research at scale (issue 13, item 4): simulator wall time and peak memory vs run size.

Each size runs in its own process under ``/usr/bin/time -v`` (peak RSS of the
whole process, workload generation included), with streaming metrics, on a
fleet of ``--instances`` instances at ``--qps-per-instance`` each. The machine
may be shared: the 1-minute load average before and after each run is kept,
and CPU time (user + sys) is reported beside wall time because it is less
sensitive to other processes than wall time.

    PYTHONPATH=shared:services python infra/experiments/sim_scaling.py \\
        --sizes 1000 10000 100000 1000000 --out docs/results/sim_scaling.json
    PYTHONPATH=shared:services python infra/experiments/sim_scaling.py --target \\
        --out docs/results/sim_scaling_10k_target.json   # the issue's 10k sarathi run
    python infra/experiments/sim_scaling.py --plot docs/results/sim_scaling.json \\
        --png docs/results/sim_scaling.png
    PYTHONPATH=shared:services python infra/experiments/sim_scaling.py --sizes 1000000 \\
        --workers 2 --out docs/results/sim_scaling_1m_workers2.json   # two processes

With ``--workers N`` the run is split over N processes (``sim.parallel``; noise from
one stream per instance, ``--noise-streams instance``, which the split needs): CPU
time is the whole tree's (``time -v`` counts waited-for children), and the peak RSS
of every process is summed from the summary (``time -v`` gives only the largest).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET = ["--policy", "sarathi", "--model", "llama-3-8b", "--gpu", "a100", "--trace", "sharegpt",
          "--qps", "1.5", "--num-requests", "10000", "--ttft-slo", "1", "--tbt-slo", "0.15"]


def _time_v(stderr: str, label: str) -> str | None:
    m = re.search(rf"{re.escape(label)}: (.+)", stderr)
    return m.group(1).strip() if m else None


def _elapsed(text: str | None) -> float | None:
    if text is None:
        return None
    parts = [float(p) for p in text.split(":")]
    return float(sum(p * 60.0 ** k for k, p in enumerate(reversed(parts))))


def run_one(cli_args: list[str], timeout: float) -> dict[str, Any]:
    """One ``sloserve simulate`` in its own process: summary, wall, CPU, peak RSS, load."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "sloserve.services.cli", "simulate",
           *cli_args, "--json"]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    # its own process group, so a cut-off run is ended whole (time -v and the simulator)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"args": cli_args, "timed_out": True, "timeout_s": timeout,
                "load_before": load0, "load_after": os.getloadavg()[0]}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"simulate failed ({proc.returncode}): {err[-2000:]}")
    summary = json.loads(out)
    rss_kb = _time_v(err, "Maximum resident set size (kbytes)")
    user, sys_ = _time_v(err, "User time (seconds)"), _time_v(err, "System time (seconds)")
    return {
        "args": cli_args,
        "timed_out": False,
        "process_wall_s": round(wall, 2),
        "elapsed_s": _elapsed(_time_v(err, "Elapsed (wall clock) time (h:mm:ss or m:ss)")),
        "cpu_s": None if user is None or sys_ is None else round(float(user) + float(sys_), 2),
        "peak_rss_mb": None if rss_kb is None else round(int(rss_kb) / 1024, 1),
        "load_before": load0,
        "load_after": os.getloadavg()[0],
        "summary": summary,
    }


SETUP_PROBE = """
import json, resource, sys, time
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation
n, inst, qps = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
t0 = time.process_time()
sim = Simulation(SimConfig(policy="sarathi", trace="sharegpt", instances=inst, qps=qps,
                           num_requests=n, ttft_slo=1.0, tbt_slo=0.15, metrics="stream"))
print(json.dumps({"num_requests": len(sim.workload.requests),
                  "setup_cpu_s": round(time.process_time() - t0, 2),
                  "setup_peak_rss_mb": round(
                      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def probe_setup(n: int, instances: int, qps: float) -> dict[str, Any]:
    """Workload generation and simulator construction alone for ``n`` requests: the part of
    a run's memory that is there before the first event (every request is built up front)."""
    proc = subprocess.run([sys.executable, "-c", SETUP_PROBE, str(n), str(instances), str(qps)],
                          capture_output=True, text=True, check=True)
    row: dict[str, Any] = json.loads(proc.stdout)
    return row


class _OutOfTime(Exception):
    pass


def partial_run(n: int, instances: int, qps: float, budget_s: float, every: int,
                out_path: Path) -> dict[str, Any]:
    """A run too long to finish here: simulate ``n`` requests in this process for at most
    ``budget_s`` CPU seconds, recording progress (requests finished, CPU, RSS) every
    ``every`` finished requests, so its rate and memory are measured, not guessed."""
    import resource

    from sloserve.sim import simulator
    from sloserve.sim.config import SimConfig

    t0 = time.process_time()
    sim = simulator.Simulation(SimConfig(
        policy="sarathi", trace="sharegpt", instances=instances, qps=qps, num_requests=n,
        ttft_slo=1.0, tbt_slo=0.15, metrics="stream"))
    setup = time.process_time() - t0
    points: list[dict[str, Any]] = []
    row: dict[str, Any] = {"num_requests": n, "instances": instances, "qps": qps,
                           "setup_cpu_s": round(setup, 2), "budget_cpu_s": budget_s,
                           "points": points}
    retire = sim._retire
    done = 0

    def counted(request_id: str) -> None:
        nonlocal done
        retire(request_id)
        done += 1
        if done % every == 0:
            cpu = time.process_time() - t0
            points.append({"finished": done, "cpu_s": round(cpu, 2),
                           "iterations": sim.num_iterations,
                           "rss_mb": round(resource.getrusage(
                               resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                           "load": os.getloadavg()[0]})
            out_path.write_text(json.dumps(row, indent=1))
            print(points[-1], flush=True)
            if cpu > budget_s:
                raise _OutOfTime

    sim._retire = counted  # type: ignore[method-assign]
    try:
        row["summary"] = sim.run()
        row["completed"] = True
    except _OutOfTime:
        row["completed"] = False
    out_path.write_text(json.dumps(row, indent=1))
    return row


def scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    out_path = Path(args.out)
    rows: list[dict[str, Any]] = []
    for n in args.sizes:
        cli = ["--policy", args.policy, "--trace", args.trace, "--instances",
               str(args.instances), "--qps", str(args.qps_per_instance * args.instances),
               "--num-requests", str(n), "--ttft-slo", "1", "--tbt-slo", "0.15",
               "--metrics", args.metrics, "--seed", str(args.seed)]
        if args.workers > 1:
            cli += ["--workers", str(args.workers), "--noise-streams", "instance"]
        row = run_one(cli, args.timeout)
        row["num_requests"] = n
        s = row.get("summary", {})
        if "worker_peak_rss_mb" in s:  # every process's peak, summed
            row["peak_rss_sum_mb"] = round(sum(s["worker_peak_rss_mb"])
                                           + s["driver_peak_rss_mb"], 1)
        rows.append(row)
        out_path.write_text(json.dumps(rows, indent=1))  # partial results survive a cut-off
        print(f"{n:>8} requests: wall {row.get('elapsed_s')} s, cpu {row.get('cpu_s')} s, "
              f"rss {row.get('peak_rss_sum_mb', row.get('peak_rss_mb'))} MB, "
              f"iterations {s.get('iterations')}, "
              f"load {row['load_before']:.1f}->{row['load_after']:.1f}", flush=True)
        if row["timed_out"]:
            break
    return rows


def projection(partial_json: str) -> tuple[int, float, float, float]:
    """(requests, CPU s projected for all of them, CPU s measured, peak RSS MB) from a
    ``--partial`` run: its last progress point's CPU per finished request, scaled."""
    row = json.loads(Path(partial_json).read_text())
    last = row["points"][-1]
    per_request = (last["cpu_s"] - row["setup_cpu_s"]) / last["finished"]
    total = row["setup_cpu_s"] + per_request * row["num_requests"]
    return row["num_requests"], total, last["cpu_s"], max(p["rss_mb"] for p in row["points"])


def plot(json_path: str, png: str, partial_json: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in json.loads(Path(json_path).read_text()) if not r["timed_out"]]
    n = [r["num_requests"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.loglog(n, [r["elapsed_s"] for r in rows], "o-", label="wall")
    a.loglog(n, [r["cpu_s"] for r in rows], "s--", label="CPU (user+sys)")
    if partial_json:
        big, projected, measured, rss = projection(partial_json)
        done = json.loads(Path(partial_json).read_text()).get("completed", False)
        how = "in-process run" if done else "projected from a cut-off run"
        a.loglog([big], [projected], "s", mfc="none", color="C1", label=f"CPU, {big:,}, {how}")
        b.semilogx([big], [rss], "o", mfc="none", color="C0", label=f"{big:,}, {how}")
    a.axhline(600, color="grey", ls=":", label="10 min target")
    a.set_xlabel("requests")
    a.set_ylabel("seconds")
    a.set_title("simulation time (64 instances, shared 2-core host)")
    a.legend()
    b.semilogx(n, [r["peak_rss_mb"] for r in rows], "o-")
    b.axhline(4096, color="grey", ls=":", label="4 GB target")
    b.set_xlabel("requests")
    b.set_ylabel("peak RSS (MB)")
    b.set_title("peak memory (streaming metrics)")
    b.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    p.add_argument("--instances", type=int, default=64)
    p.add_argument("--qps-per-instance", type=float, default=1.5)
    p.add_argument("--policy", default="sarathi")
    p.add_argument("--trace", default="sharegpt")
    p.add_argument("--metrics", choices=("exact", "stream"), default="stream")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1,
                   help="processes per run (sloserve simulate --workers; adds "
                        "--noise-streams instance)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    p.add_argument("--target", action="store_true", help="the issue's 10k sarathi run, exact")
    p.add_argument("--repeat", type=int, default=1, help="--target: runs to make")
    p.add_argument("--out", default="docs/results/sim_scaling.json")
    p.add_argument("--plot", metavar="JSON", help="only draw the PNG from a results file")
    p.add_argument("--partial", type=int, metavar="N",
                   help="simulate N requests in-process for at most --budget CPU seconds, "
                        "recording progress")
    p.add_argument("--budget", type=float, default=1800.0)
    p.add_argument("--every", type=int, default=20000)
    p.add_argument("--probe-setup", type=int, metavar="N",
                   help="only build the workload and simulator for N requests: CPU and RSS")
    p.add_argument("--png", default="docs/results/sim_scaling.png")
    p.add_argument("--with-partial", metavar="JSON", help="--plot: add a --partial run's point")
    args = p.parse_args()
    if args.plot:
        plot(args.plot, args.png, args.with_partial)
    elif args.partial:
        partial_run(args.partial, args.instances, args.qps_per_instance * args.instances,
                    args.budget, args.every, Path(args.out))
    elif args.probe_setup:
        row = probe_setup(args.probe_setup, args.instances,
                          args.qps_per_instance * args.instances)
        print(json.dumps(row))
        Path(args.out).write_text(json.dumps(row, indent=1))
    elif args.target:
        rows = []
        for _ in range(args.repeat):
            rows.append(run_one(TARGET, args.timeout))
            r = rows[-1]
            print(f"sim_wall_s {r['summary']['sim_wall_s']} cpu {r['cpu_s']} "
                  f"rss {r['peak_rss_mb']} MB load {r['load_before']:.1f}", flush=True)
            Path(args.out).write_text(json.dumps(rows, indent=1))
    else:
        scaling(args)


if __name__ == "__main__":
    main()
