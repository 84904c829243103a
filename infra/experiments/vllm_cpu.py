"""Sim vs live on vLLM's engine: ``simulate --timing-profile`` against ``up --backend vllm``.

1. ``sloserve profile --backend vllm --model smollm2-135m --clock wall`` (the
   executor's own thread count and clock) fits Ascendra's regression on vLLM
   batches and saves the samples (``--profile``; reused when present).
2. ``sloserve up --backend vllm --model smollm2-135m --gpu cpu`` serves one
   instance; ``sloserve bench`` replays ``--num-requests`` of
   ``infra/experiments/data/sharegpt_cpu.csv`` (ShareGPT lengths / 8) at
   ``--qps`` (Poisson, seed 0, exact output lengths).
3. ``sloserve simulate --timing-profile`` runs the same workload, seed, policy
   and budget.

Prints and writes (``--out``) TTFT/TBT P50/P99 of both sides and their ratio.

    python infra/experiments/vllm_cpu.py --qps 0.1 --num-requests 40

Issue 14's table on the vLLM backend (``--loads``), each load's served batches timed
against the profile (``batch_ratios``: measured over profiled time, same shapes): the
simulated goodput capacity of the deployment (``sloserve capacity --timing-profile``, the
measured profile as ground truth), then one stack serving ``--loads`` x capacity in turn
(a warm-up at the first load, not measured), each simulated as the live stack runs it
(admission on, overlap scheduling), and live vs sim per load:

    python infra/experiments/vllm_cpu.py --loads 0.5 0.7 0.9 --dtype float32 \
        --token-budget 64 --ttft-slo 4.9646 --tbt-slo 0.7447 --num-requests 64 \
        --profile infra/experiments/data/smollm2_vllm_cpu_f32_profile_wall.json \
        --out docs/results/live_vs_sim_vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "infra/experiments/data"
TRACE = DATA / "sharegpt_cpu.csv"
PROFILE = DATA / "smollm2_vllm_cpu_profile_wall.json"
OUT = ROOT / "docs/results/vllm_cpu.json"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
KEYS = ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "throughput_tok_s")
METRICS = ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99")


def run(cmd: list[str]) -> str:
    """The command's JSON line (its last stdout line that is an object: vLLM's engine may
    log to stdout before it)."""
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed:\n{res.stderr[-2000:]}")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    return lines[-1] if lines else res.stdout


def workload(args: argparse.Namespace, qps: float | None = None) -> list[str]:
    return ["--trace-file", str(TRACE), "--qps", f"{args.qps if qps is None else qps:g}",
            "--num-requests", str(args.num_requests), "--ttft-slo", str(args.ttft_slo),
            "--tbt-slo", str(args.tbt_slo), "--seed", "0", "--json"]


def sim_flags(args: argparse.Namespace) -> list[str]:
    """``simulate``/``capacity`` flags for the deployment ``up`` runs."""
    return ["--policy", args.policy, "--model", "smollm2-135m", "--gpu", "cpu",
            "--timing-profile", str(args.profile), "--token-budget", str(args.token_budget)]


def batch_ratios(args: argparse.Namespace, since: str) -> tuple[dict[str, Any], str]:
    """The stack's executed batches since stream id ``since`` (its Redis samples stream,
    what the perf model learns from), each measured duration over the timing profile's
    noiseless time for the same shape: per source (``sweep``: the executor's warm-up,
    ``run``: served batches) count, median, P10/P90 and sum over sum. Returns the last id."""
    import numpy as np
    import redis

    from sloserve.perf.measured import MeasuredTiming
    from sloserve.services.perfmodel.samples import decode
    from sloserve.services.store import Keys

    truth = MeasuredTiming.from_file(args.profile, noise_cv=0.0)
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], redis.Redis.from_url(REDIS_URL).xrange(
        Keys(args.prefix).samples, min=f"({since}" if since else "-"))
    by_src: dict[str, list[tuple[float, float]]] = {}
    for _, fields in entries:
        sample = decode(fields)
        by_src.setdefault(fields[b"src"].decode(), []).append(
            (sample.duration, truth.batch_time(sample.shape)))
    out: dict[str, Any] = {}
    for src, pairs in by_src.items():
        t, pred = np.array(pairs).T
        r = t / pred
        out[src] = {"batches": len(r), "median": float(np.median(r)),
                    "p10": float(np.percentile(r, 10)), "p90": float(np.percentile(r, 90)),
                    "sum_over_sum": float(t.sum() / pred.sum())}
    last = entries[-1][0].decode() if entries else since
    return out, last


def start_up(args: argparse.Namespace) -> subprocess.Popen[str]:
    up = subprocess.Popen(
        ["sloserve", "up", "--backend", "vllm", "--model", "smollm2-135m", "--gpu", "cpu",
         "--prefix", args.prefix,
         "--policy", args.policy, "--token-budget", str(args.token_budget),
         "--port", str(args.port), "--redis-url", REDIS_URL, "--http-port", "0",
         "--ttft-slo", str(args.ttft_slo), "--tbt-slo", str(args.tbt_slo),
         *(["--dtype", args.dtype] if args.dtype else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert up.stdout is not None
    for line in up.stdout:
        if line.startswith("gateway ready"):
            break
    else:
        raise SystemExit(f"sloserve up exited: {up.wait()}")
    time.sleep(5.0)  # the executor's warm-up sweep publishes before plans run
    return up


def loads(args: argparse.Namespace, prof: dict[str, Any] | None) -> int:
    """Live vs sim at ``args.loads`` x the simulated goodput capacity, one stack."""
    cap = json.loads(run(["sloserve", "capacity", *sim_flags(args), "--admission", "--overlap",
                          "--criterion", "goodput", "--target", "0.9",
                          *workload(args)[:-1], "--json"]))
    capacity = float(cap["capacity_qps"])
    print(f"simulated goodput capacity {capacity:.3f} req/s", flush=True)
    rows: list[dict[str, Any]] = []
    up = start_up(args)
    try:
        run(["sloserve", "bench", "--target", f"127.0.0.1:{args.port}",
             *workload(args, args.loads[0] * capacity), "--prompt-salt", "warmup"])
        warm_batches, mark = batch_ratios(args, "")
        print("batch time / profile, warm-up:", json.dumps(warm_batches), flush=True)
        for x in args.loads:
            qps = round(x * capacity, 4)
            before = os.getloadavg()
            live = json.loads(run(["sloserve", "bench", "--target", f"127.0.0.1:{args.port}",
                                   *workload(args, qps)]))
            after = os.getloadavg()
            sim = json.loads(run(["sloserve", "simulate", *sim_flags(args), "--admission",
                                  "--overlap", *workload(args, qps)]))
            batches, mark = batch_ratios(args, mark)
            print(f"batch time / profile at {x:g}:", json.dumps(batches), flush=True)
            cells = {k: {"live": live[k], "sim": sim[k],
                         "diff": (live[k] - sim[k]) / sim[k] if sim[k] else None}
                     for k in METRICS}
            rows.append({"load": x, "qps": qps, "loadavg_before": before,
                         "loadavg_after": after, "metrics": cells,
                         "live_completed": live["completed"], "sim_completed": sim["completed"],
                         "batch_time_over_profile": batches,
                         "live": live, "sim": sim})
            print(f"{x:g} x ({qps:g} req/s): " + ", ".join(
                f"{k} {c['live']:.3f}/{c['sim']:.3f} ({c['diff']:+.1%})"
                for k, c in cells.items()), flush=True)
    finally:
        up.terminate()
        up.wait(timeout=60)
    doc = {"args": {k: str(v) for k, v in vars(args).items()}, "profile_fit": prof,
           "capacity": cap, "capacity_qps": capacity, "rows": rows,
           "batch_time_over_profile_warmup": warm_batches}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def pick(d: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                flat[f"{k}_{k2}"] = v2
        else:
            flat[k] = v
    return flat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="sarathi")
    ap.add_argument("--token-budget", type=int, default=256)
    ap.add_argument("--qps", type=float, default=0.1)
    ap.add_argument("--num-requests", type=int, default=40)
    ap.add_argument("--ttft-slo", type=float, default=60.0)
    ap.add_argument("--tbt-slo", type=float, default=10.0)
    ap.add_argument("--port", type=int, default=50561)
    ap.add_argument("--profile", type=Path, default=PROFILE)
    ap.add_argument("--repeats", type=int, default=2, help="profile: timings per shape")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--dtype", default=None, help="profile and up (default: the backend's)")
    ap.add_argument("--loads", nargs="+", type=float, default=None,
                    help="fractions of the simulated goodput capacity (issue 14's table)")
    args = ap.parse_args()
    args.prefix = f"sloserve:vllmcpu{os.getpid()}"  # its samples stream: batch_ratios
    prof: dict[str, Any] | None = None
    if not args.profile.exists():
        prof = json.loads(run(["sloserve", "profile", "--backend", "vllm", "--model",
                               "smollm2-135m", "--clock", "wall", "--repeats",
                               str(args.repeats), *(["--dtype", args.dtype] if args.dtype else []),
                               "--json", "--out", str(args.profile)]))
        print("profile:", json.dumps(prof), flush=True)
    if args.loads:
        return loads(args, prof)
    up = start_up(args)
    try:
        start = time.time()
        live = json.loads(run(["sloserve", "bench", "--target", f"127.0.0.1:{args.port}",
                               *workload(args)]))
        live_wall = time.time() - start
    finally:
        up.terminate()
        up.wait(timeout=30)
    sim = json.loads(run(["sloserve", "simulate", *sim_flags(args), *workload(args)]))
    lf, sf = pick(live), pick(sim)
    rows = {k: {"live": lf.get(k), "sim": sf.get(k),
                "live_over_sim": (lf[k] / sf[k]) if lf.get(k) and sf.get(k) else None}
            for k in sorted(set(lf) & set(sf))
            if isinstance(lf.get(k), (int, float)) and isinstance(sf.get(k), (int, float))}
    doc = {"args": {k: str(v) for k, v in vars(args).items()}, "profile_fit": prof,
           "live_wall_s": live_wall, "live": live, "sim": sim, "compare": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for k, r in rows.items():
        if any(s in k for s in ("ttft", "tbt", "throughput")):
            print(f"{k:<28} live {r['live']!s:<24} sim {r['sim']!s:<24} ratio {r['live_over_sim']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
