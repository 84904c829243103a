"""Issue 33 (multi-turn line): where a live request's TTFT goes, against the simulator's
TTFT for the same request.

    PYTHONPATH=shared:services python infra/experiments/multiturn_ttft.py \
        {prefix|round-robin} OUT.json [--port P] [--profile FILE] [--seed S] \
        [--overhead-out FILE]

Starts a fresh stack (``up --instances 4``, sim backend, llama-3-8b/a100 ground truth,
``--prefix-routing`` or not; Redis at ``$REDIS_URL``), replays ``bench --trace multiturn
--qps 4 --num-requests 200`` through the SDK with the bench's probe, reads the prefix-cache
counters from the gateway's ``/metrics``, and simulates the same workload on the deployment
the stack reports (``bench --compare-sim``'s ``sim_config``: overlap, prefix routing, the
executors' noise streams, prompt-only prefix identity) with and without the overhead profile
``--profile`` (a separate run's, ``bench --overhead-out``). Per request it splits the live
TTFT (gateway stamp -> first token at the gateway) into the instance side (stamp -> end of
the iteration that produced the first token, ``GenerateChunk.produced_time``) and the
first token's delivery (that end -> the gateway's emit), beside the client's send lateness
(workload offset -> gateway stamp, outside TTFT) and the simulated TTFT of the same request.
Results: docs/serve.md, "Prefix caching and prefix-aware routing".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

NUM_REQUESTS, QPS, INSTANCES = 200, 4.0, 4


def prefix_counters(http: str) -> tuple[float, float]:
    """(queries, hits) summed over the gateway's per-instance ``/metrics`` series."""
    text = urllib.request.urlopen(f"{http}/metrics", timeout=10).read().decode()
    sums = []
    for name in ("queries", "hits"):
        sums.append(sum(float(v) for v in re.findall(
            rf"^vllm:prefix_cache_{name}_total{{[^}}]*}} (\S+)$", text, re.M)))
    return sums[0], sums[1]


def hist_means(http: str) -> dict[str, float | None]:
    """Mean queue time (arrival -> first scheduling) and prefill time (first scheduling ->
    first token), ms, on the schedulers' clocks: the gateway's vLLM histograms."""
    text = urllib.request.urlopen(f"{http}/metrics", timeout=10).read().decode()
    out: dict[str, float | None] = {}
    for name in ("request_queue_time", "request_prefill_time"):
        tot = [sum(float(v) for v in re.findall(
            rf"^vllm:{name}_seconds_{part}(?:{{[^}}]*}})? (\S+)$", text, re.M))
            for part in ("sum", "count")]
        out[f"{name}_mean_ms"] = tot[0] / tot[1] * 1e3 if tot[1] else None
    return out


def admitted_times(log_dir: Path) -> dict[tuple[int, int], float]:
    """(prompt tokens, max tokens) -> when a scheduler admitted that request (its
    ``request_admitted`` debug line; the gateway names requests by ids of its own); a key
    two requests share is left out."""
    from datetime import datetime

    out: dict[tuple[int, int], float] = {}
    seen: set[tuple[int, int]] = set()
    for path in log_dir.glob("scheduler-*.log"):
        for line in path.read_text().splitlines():
            if '"request_admitted"' not in line:
                continue
            rec = json.loads(line)
            t = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
            key = (int(rec["prompt_tokens"]), int(rec["max_tokens"]))
            if key in seen:
                out.pop(key, None)
            else:
                seen.add(key)
                out[key] = t
    return out


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, float) * 1e3
    return {"p10_ms": float(np.percentile(a, 10)), "p50_ms": float(np.percentile(a, 50)),
            "p90_ms": float(np.percentile(a, 90)), "mean_ms": float(a.mean())}


async def drive(target: str, args: argparse.Namespace,
                offsets: dict[str, float]) -> tuple[list[Any], Any, dict[str, Any], list[Any]]:
    from sloserve.client import AsyncClient
    from sloserve.services import compare_sim
    from sloserve.services.bench_cmd import _one, send_all, workload_rows

    probe = compare_sim.LiveTimings()
    async with AsyncClient(target) as client:
        info = await client.info()
        reqs, _ = workload_rows(args, info["model"], info["instances"][0]["hardware"])
        offsets.update({r.request_id: r.arrival_time for r in reqs})
        await send_all(reqs, lambda r, t0, bar: _one(client, r, t0, bar, probe),
                       progress=False, probe=probe)
    probe.after_run(reqs)
    sts = await compare_sim.statuses(info, samples=True)
    return reqs, probe, info, sts


def simulated_ttft(cfg: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """request id -> simulated TTFT, and the summary (hit rate, TTFT P50, mean queue and
    prefill time as the live histograms define them)."""
    from sloserve.sim.simulator import Simulation

    sim = Simulation(cfg)
    summary = sim.run()
    reqs = sim.measured()
    assert isinstance(reqs, list)
    sched = [(r.arrival_time, r.first_scheduled_time, r.token_times[0]) for r in reqs
             if r.token_times and r.first_scheduled_time is not None]
    summary["request_queue_time_mean_ms"] = float(np.mean([s - a for a, s, _ in sched])) * 1e3
    summary["request_prefill_time_mean_ms"] = float(np.mean([f - s for _, s, f in sched])) * 1e3
    return ({r.request_id: r.token_times[0] - r.arrival_time for r in reqs if r.token_times},
            summary)


def main() -> int:
    from sloserve.services.bench_cmd import add_parser as bench_parser
    from sloserve.services.cli import build_parser
    from sloserve.services.compare_sim import sim_config
    from sloserve.services.stack import Stack
    from sloserve.services.up_cmd import config_from_args

    ap = argparse.ArgumentParser()
    ap.add_argument("routing", choices=("prefix", "round-robin"))
    ap.add_argument("out")
    ap.add_argument("--port", type=int, default=27600)
    ap.add_argument("--profile", default=None, help="an overhead profile from another run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-level", default="info", choices=("info", "debug"),
                    help="debug: each scheduler logs when it admitted each request; the "
                         "submit hop (gateway stamp -> admitted) is reported per request")
    ap.add_argument("--overhead-out", default=None,
                    help="save this run's overhead profile (bench --overhead-out)")
    a = ap.parse_args()
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    bench_parser(sub)
    bargs = sub.choices["bench"].parse_args([
        "--trace", "multiturn", "--qps", str(QPS), "--num-requests", str(NUM_REQUESTS),
        "--seed", str(a.seed)])
    bargs.qps = QPS
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/12")
    log_dir = tempfile.mkdtemp(prefix="multiturn-ttft-")
    up = build_parser().parse_args([
        "up", "--instances", str(INSTANCES), "--port", str(a.port), "--log-level", a.log_level,
        "--http-port", str(a.port + 1), "--redis-url", redis_url,
        "--prefix", f"sloserve:mt{os.getpid()}",
        "--log-dir", log_dir,
        *(["--prefix-routing"] if a.routing == "prefix" else [])])
    os.environ.setdefault("SLOSERVE_INTERNAL_TOKEN", "multiturn-ttft-" + os.urandom(16).hex())
    load_before = os.getloadavg()[0]
    cpu0 = time.process_time()
    with Stack(config_from_args(up)) as stack:
        offsets: dict[str, float] = {}  # the workload's own offsets, for the send lateness
        reqs, probe, info, sts = asyncio.run(drive(stack.gateway, bargs, offsets))
        queries, hits = prefix_counters(stack.http)
        phases = hist_means(stack.http)
    load_after = os.getloadavg()[0]
    if a.overhead_out:
        from sloserve.services.compare_sim import overhead_profile

        overhead_profile(sts, "sim", {
            "command": "infra/experiments/multiturn_ttft.py", "routing": a.routing,
            "trace": "multiturn", "qps": QPS, "num_requests": NUM_REQUESTS, "seed": a.seed,
            "load_avg_1m": [load_before, load_after]}, probe.delivery_lag_s).save(a.overhead_out)
    live_ttft, inst_ttft, delivery, lateness, ids = [], [], [], [], []
    for r in reqs:
        produced = probe.produced.get(r.request_id, [])
        if not r.token_times or not produced:
            continue
        ids.append(r.request_id)
        live_ttft.append(r.token_times[0] - r.arrival_time)
        inst_ttft.append(produced[0] - r.arrival_time)
        delivery.append(r.token_times[0] - produced[0])
        lateness.append(r.arrival_time - probe.wall_t0 - offsets[r.request_id])
    from sloserve.metrics import summarize

    live_summary = summarize(reqs)
    out: dict[str, Any] = {
        "routing": a.routing, "seed": a.seed, "requests": len(reqs), "joined": len(ids),
        "load_avg_1m": [load_before, load_after],
        "bench_cpu_s": time.process_time() - cpu0,
        "live": {"ttft_p50_ms": float(live_summary["ttft_p50"] or 0.0) * 1e3,
                 "prefix_hit_rate": hits / queries if queries else None,
                 "prefix_query_tokens": queries, "prefix_hit_tokens": hits,
                 "ttft": pct(live_ttft), "instance_side_ttft": pct(inst_ttft),
                 "first_token_delivery": pct(delivery), "send_lateness": pct(lateness),
                 **phases,
                 "unhidden_p50_ms": [st.unhidden_p50_s * 1e3 for st in sts],
                 "unhidden_p99_ms": [st.unhidden_p99_s * 1e3 for st in sts]},
    }
    if a.log_level == "debug":
        admitted = admitted_times(Path(log_dir))
        hop = [admitted[(r.prompt_len, r.output_len)] - r.arrival_time for r in reqs
               if (r.prompt_len, r.output_len) in admitted and r.token_times]
        out["live"]["submit_hop_joined"] = len(hop)
        out["live"]["submit_hop"] = pct(hop)
    base = sim_config(bargs, info, sts, None)
    arms = {"sim": base,
            "sim_cache_outputs": dataclasses.replace(base, prefix_cache_outputs=True),
            "sim_no_overlap_cache_outputs": dataclasses.replace(
                base, prefix_cache_outputs=True, overlap=False)}
    if a.profile:
        arms["sim_profile"] = dataclasses.replace(base, overhead_profile=a.profile)
    for name, cfg in arms.items():
        per, summary = simulated_ttft(cfg)
        diff_inst = [i - per[k] for k, i in zip(ids, inst_ttft, strict=True) if k in per]
        diff_live = [x - per[k] for k, x in zip(ids, live_ttft, strict=True) if k in per]
        out[name] = {"ttft_p50_ms": summary["ttft_p50"] * 1e3,
                     "prefix_hit_rate": summary.get("prefix_hit_rate"),
                     "prefix_hit_tokens": summary.get("prefix_hit_tokens"),
                     "request_queue_time_mean_ms": summary["request_queue_time_mean_ms"],
                     "request_prefill_time_mean_ms": summary["request_prefill_time_mean_ms"],
                     "overlap": cfg.overlap, "prefix_routing": cfg.prefix_routing,
                     "prefix_cache_outputs": cfg.prefix_cache_outputs,
                     "overhead_profile": cfg.overhead_profile,
                     "per_request_live_minus_sim": pct(diff_live),
                     "per_request_instance_side_minus_sim": pct(diff_inst)}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    json.dump(out, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
