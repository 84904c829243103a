"""Live CPU comparison: ``sloserve bench`` against ``sloserve up --backend torch`` vs
``sloserve simulate --timing-profile`` (docs/torch-executor.md, "Live CPU comparison").

One instance of the ``tiny`` model on this CPU; the workload is
``infra/experiments/data/sharegpt_cpu.csv`` (ShareGPT lengths / 8, see
``make_sharegpt_cpu.py``). The SLOs and Sarathi's token budget are the A100
defaults (TTFT 1 s, TBT 0.15 s, budget 512) scaled the same way: the budget by
the length factor, the SLOs by the ratio of a typical mixed iteration here
(profile fit) to the same iteration, unscaled, for llama-3-8b on an A100
(``ProfileTiming``). For each policy the stack is started once and every rate
is benched, each followed at once by ``simulate`` at the same rate (same
seed, workload and SLOs). Per run it also records the executor's measured
batch times (the Redis samples stream) against the profile's prediction of the
same shapes, and the scheduler's iteration count and overhead (``Status``).

    python infra/experiments/torch_cpu.py [--policies vllm sarathi accelgen]
        [--num-requests 300] [--rates 0.4 0.7 1.0 1.3]  # x simulated goodput capacity

Writes docs/results/torch_cpu.json and prints a table.
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

import grpc
import numpy as np
import redis

from sloserve.batch import BatchShape
from sloserve.metrics import meets
from sloserve.perf.ground_truth import ProfileTiming
from sloserve.perf.measured import MeasuredTiming
from sloserve.policies import get_spec
from sloserve.services.perfmodel import samples as sample_codec
from sloserve.services.proto import scheduler_grpc, scheduler_pb2

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "infra/experiments/data"
TRACE = DATA / "sharegpt_cpu.csv"
PROFILE_1T = DATA / "tiny_cpu_profile_1t_cputime.json"  # `sloserve profile` defaults
OUT = ROOT / "docs/results/torch_cpu.json"
SCALE = 8  # make_sharegpt_cpu.SCALE
A100_TTFT, A100_TBT, A100_BUDGET = 1.0, 0.15, 512
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CRITERIA = ("goodput", "tail", "token")


def run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def serving_profile(threads: int) -> Path:
    """The executor's conditions: its torch threads, wall clock (what it reports)."""
    return DATA / f"tiny_cpu_profile_{threads}t_wall.json"


def ensure_profiles(threads: int) -> None:
    path = serving_profile(threads)
    if not path.exists():
        run(["sloserve", "profile", "--backend", "torch", "--model", "tiny", "--threads",
             str(threads), "--clock", "wall", "--json", "--out", str(path)])
    if not PROFILE_1T.exists():
        run(["sloserve", "profile", "--backend", "torch", "--model", "tiny", "--json",
             "--out", str(PROFILE_1T)])


def slo_scale(profile: MeasuredTiming) -> dict[str, float]:
    """CPU/A100 ratio of a typical mixed iteration: one budget-sized chunk over earlier
    context plus 16 decodes at ShareGPT's typical decode context (lengths / SCALE here)."""
    a100 = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0)
    full = BatchShape(((A100_BUDGET, 1024),), (2560,) * 16)
    scaled = BatchShape(((A100_BUDGET // SCALE, 1024 // SCALE),), (2560 // SCALE,) * 16)
    t_cpu, t_gpu = profile.noiseless_time(scaled), a100.noiseless_time(full)
    r = t_cpu / t_gpu
    return {"iteration_cpu_s": t_cpu, "iteration_a100_s": t_gpu, "ratio": r,
            "ttft_slo": round(A100_TTFT * r, 4), "tbt_slo": round(A100_TBT * r, 4),
            "token_budget": A100_BUDGET // SCALE}


def budget_args(policy: str, slo: dict[str, float]) -> list[str]:
    """``--token-budget`` where the policy has that knob (vllm has not)."""
    if "token_budget" not in get_spec(policy).knobs():
        return []
    return ["--token-budget", str(slo["token_budget"])]


def workload_args(qps: float, n: int, slo: dict[str, float]) -> list[str]:
    return ["--trace-file", str(TRACE), "--qps", f"{qps:g}", "--num-requests", str(n),
            "--ttft-slo", str(slo["ttft_slo"]), "--tbt-slo", str(slo["tbt_slo"]),
            "--seed", "0", "--json"]


def simulate(
    policy: str, qps: float, n: int, slo: dict[str, float], profile: Path
) -> dict[str, Any]:
    out = run(["sloserve", "simulate", "--policy", policy, "--model", "tiny",
               "--timing-profile", str(profile), *budget_args(policy, slo),
               *workload_args(qps, n, slo)])
    return dict(json.loads(out))


def sim_capacity(
    policy: str, criterion: str, n: int, slo: dict[str, float], profile: Path
) -> float:
    out = run(["sloserve", "capacity", "--policy", policy, "--model", "tiny",
               "--timing-profile", str(profile), *budget_args(policy, slo),
               "--trace-file", str(TRACE), "--num-requests", str(n),
               "--ttft-slo", str(slo["ttft_slo"]), "--tbt-slo", str(slo["tbt_slo"]),
               "--criterion", criterion, "--json"])
    return float(json.loads(out)["capacity_qps"])


class LiveStack:
    """``sloserve up --backend torch --model tiny --gpu cpu`` in a child process."""

    def __init__(self, policy: str, port: int, slo: dict[str, float], threads: int) -> None:
        self.prefix = f"torchcpu:{policy}:{os.getpid()}"
        self.proc = subprocess.Popen(
            ["sloserve", "up", "--backend", "torch", "--model", "tiny", "--gpu", "cpu",
             "--policy", policy, "--port", str(port), "--redis-url", REDIS_URL,
             "--prefix", self.prefix, *budget_args(policy, slo),
             "--ttft-slo", str(slo["ttft_slo"]), "--tbt-slo", str(slo["tbt_slo"])],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)},  # torch's intra-op threads
        )
        self.addresses: dict[str, str] = {}
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 2:
                self.addresses[parts[0]] = parts[1]
            if line.startswith("gateway ready"):
                break
        else:
            raise RuntimeError(f"sloserve up --policy {policy} exited: {self.proc.wait()}")
        self.gateway = self.addresses["gateway"]
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.last_id = "0-0"

    def status(self) -> scheduler_pb2.SchedulerStatus:
        with grpc.insecure_channel(self.addresses["scheduler-lp0"]) as ch:
            status: scheduler_pb2.SchedulerStatus = scheduler_grpc.SchedulerStub(ch).Status(
                scheduler_pb2.StatusRequest())
            return status

    def run_samples(self) -> list[Any]:
        """Executed batches appended to the samples stream since the last call."""
        time.sleep(0.5)  # the executor flushes every 0.1 s
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       self.redis.xrange(f"{self.prefix}:samples", min=f"({self.last_id}"))
        if entries:
            self.last_id = entries[-1][0].decode()
        return [sample_codec.decode(f) for _, f in entries if f[b"src"] == b"run"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.redis.delete(*self.redis.keys(f"{self.prefix}:*") or ["_none_"])


def bench(stack: LiveStack, qps: float, n: int, slo: dict[str, float]) -> dict[str, Any]:
    out = run(["sloserve", "bench", "--target", stack.gateway, *workload_args(qps, n, slo)])
    return dict(json.loads(out))


def execution_check(batches: list[Any], profiles: dict[str, MeasuredTiming]) -> dict[str, Any]:
    """The executor's measured batch times vs each profile's fit on the same shapes."""
    measured = np.array([b.duration for b in batches])
    out: dict[str, Any] = {"batches": len(batches), "measured_total_s": float(measured.sum()),
                           "measured_p50_ms": float(np.median(measured) * 1e3)}
    for name, prof in profiles.items():
        pred = np.array([prof.noiseless_time(b.shape) for b in batches])
        out[f"ratio_{name}"] = float(measured.sum() / pred.sum())
        out[f"ratio_p50_{name}"] = float(np.median(measured / pred))
    # beyond the profile's sweep (512 tokens a batch) the fit extrapolates
    tokens = np.array([b.shape.num_tokens for b in batches])
    pred = np.array([profiles["serving"].noiseless_time(b.shape) for b in batches])
    for label, sel in (("le512", tokens <= 512), ("gt512", tokens > 512)):
        if sel.any():
            out[f"ratio_serving_{label}"] = float(measured[sel].sum() / pred[sel].sum())
            out[f"measured_s_{label}"] = float(measured[sel].sum())
            out[f"batches_{label}"] = int(sel.sum())
    return out


def verdicts(summary: dict[str, Any], tbt_slo: float) -> dict[str, bool | None]:
    v: dict[str, bool | None] = {c: meets(summary, c, tbt_slo=tbt_slo)
                                 for c in ("goodput", "token")}
    p99 = summary["tbt_token_p99"]
    v["tail_p99"] = p99 is None or p99 <= tbt_slo
    v["tail"] = (meets(summary, "tail", tbt_slo=tbt_slo)
                 if summary.get("sched_delay_p50") is not None else None)
    return v


def bracket(rows: list[dict[str, Any]], side: str, crit: str) -> dict[str, float | None]:
    """Highest benched rate that meets ``crit`` below the lowest one that misses it."""
    ok = sorted((r["qps"], r[side]["meets"][crit]) for r in rows)
    fails = [q for q, m in ok if m is False]
    first_fail = min(fails) if fails else None
    passes = [q for q, m in ok if m and (first_fail is None or q < first_fail)]
    return {"meets_up_to": max(passes) if passes else None, "misses_from": first_fail}


def shape_check(threads: int, profile: Path) -> list[dict[str, Any]]:
    """Engine time of decode batches with equal vs mixed contexts (same KV slots) and
    of prefills past the sweep, against the profile fit (median of 7 runs)."""
    import torch

    from sloserve.model.engine import TorchEngine

    torch.set_num_threads(threads)
    engine = TorchEngine("tiny", num_blocks=8192)
    fit = MeasuredTiming.from_file(profile, noise_cv=0.0)
    shapes = {
        "64 decodes, ctx 300 each": BatchShape((), (300,) * 64),
        "64 decodes, 32 x ctx 50 + 32 x ctx 550": BatchShape((), (50,) * 32 + (550,) * 32),
        "64 decodes, 63 x ctx 50 + 1 x ctx 1000": BatchShape((), (50,) * 63 + (1000,)),
        "128 decodes, ctx 300 each": BatchShape((), (300,) * 128),
        "128 decodes, 127 x ctx 50 + 1 x ctx 1000": BatchShape((), (50,) * 127 + (1000,)),
        "prefill 4 x 300 tokens": BatchShape(((300, 0),) * 4, ()),
        "prefill 1 x 1200 tokens": BatchShape(((1200, 0),), ()),
    }
    rows = []
    for name, shape in shapes.items():
        measured = float(np.median([engine.profile_batch(shape) for _ in range(7)]))
        predicted = fit.noiseless_time(shape)
        rows.append({"shape": name, "measured_ms": measured * 1e3,
                     "profile_fit_ms": predicted * 1e3, "ratio": measured / predicted})
        print(f"{name:42s} {measured * 1e3:8.2f} ms  fit {predicted * 1e3:8.2f} ms", flush=True)
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The docs table: live vs simulated per policy and rate (tail = P99-gap part on live)."""
    lines = ["| policy | qps | side | goodput | token | TTFT p50/p99 ms | P99 gap ms | "
             "iterations | met (G/T/K) | exec/profile | overhead p50 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for policy, res in result["policies"].items():
        for row in res["rows"]:
            for side in ("live", "sim"):
                s, m = row[side]["summary"], row[side]["meets"]
                tail = m["tail"] if m["tail"] is not None else m["tail_p99"]
                met = "/".join("y" if x else "n" for x in (m["goodput"], tail, m["token"]))
                live = side == "live"
                ratio = f"{row['live']['execution']['ratio_serving']:.2f}" if live else "-"
                ovh = f"{row['live']['overhead_p50_ms']:.2f} ms" if live else "-"
                lines.append(
                    f"| {policy} | {row['qps']:g} | {side} | {s['goodput_share']:.2f} | "
                    f"{s['token_criterion_share']:.2f} | {1e3 * s['ttft_p50']:.0f}/"
                    f"{1e3 * s['ttft_p99']:.0f} | {1e3 * s['tbt_token_p99']:.1f} | "
                    f"{row[side]['iterations']} | {met} | {ratio} | {ovh} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", nargs="+", default=["vllm", "sarathi", "accelgen"])
    ap.add_argument("--num-requests", type=int, default=300)
    ap.add_argument("--rates", nargs="+", type=float, default=[0.4, 0.7, 1.0, 1.3],
                    help="multiples of the simulated goodput capacity")
    ap.add_argument("--port", type=int, default=50461)
    ap.add_argument("--threads", type=int, default=1,
                    help="executor torch threads (OMP_NUM_THREADS of the stack)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table", action="store_true", help="print --out as markdown and exit")
    ap.add_argument("--append-to", default=None,
                    help="store this run under checks.KEY of the existing --out file")
    ap.add_argument("--shape-check", action="store_true",
                    help="time padded-decode and long-prefill shapes instead of benching")
    ap.add_argument("--slo-from", default=None, help="JSON of fixed SLOs (default: scaled)")
    args = ap.parse_args()
    if args.table:
        print(markdown(json.loads(args.out.read_text())))
        return
    threads = args.threads
    ensure_profiles(threads)
    profile = serving_profile(threads)
    if args.shape_check:
        save(args, {"threads": threads, "profile": profile.name,
                    "shapes": shape_check(threads, profile)})
        return
    profiles = {"serving": MeasuredTiming.from_file(profile, noise_cv=0.0),
                "1t_cputime": MeasuredTiming.from_file(PROFILE_1T, noise_cv=0.0)}
    slo = slo_scale(profiles["serving"]) if args.slo_from is None else json.loads(args.slo_from)
    n = args.num_requests
    result: dict[str, Any] = {"slo": slo, "profile": profile.name, "num_requests": n,
                              "scale": SCALE, "executor_threads": threads, "policies": {}}
    print(f"SLOs {slo}", flush=True)
    for policy in args.policies:
        caps = {c: sim_capacity(policy, c, n, slo, profile) for c in CRITERIA}
        rates = [round(caps["goodput"] * m, 1) for m in args.rates]
        stack = LiveStack(policy, args.port, slo, threads)
        rows: list[dict[str, Any]] = []
        try:
            stack.run_samples()  # skip the warm-up sweep
            for qps in rates:
                it0 = stack.status().iterations
                live = bench(stack, qps, n, slo)
                st = stack.status()
                check = execution_check(stack.run_samples(), profiles)
                sim = simulate(policy, qps, n, slo, profile)
                rows.append({
                    "qps": qps,
                    "live": {"summary": live, "meets": verdicts(live, slo["tbt_slo"]),
                             "iterations": st.iterations - it0,
                             "overhead_p50_ms": st.overhead_p50_s * 1e3,
                             "overhead_p99_ms": st.overhead_p99_s * 1e3,
                             "execution": check},
                    "sim": {"summary": sim, "meets": verdicts(sim, slo["tbt_slo"]),
                            "iterations": sim["iterations"]},
                })
                print_row(policy, rows[-1])
        finally:
            stack.close()
        result["policies"][policy] = {
            "sim_capacity_qps": caps, "rows": rows,
            "brackets": {side: {c: bracket(rows, side, c) for c in ("goodput", "tail_p99",
                                                                     "tail", "token")}
                         for side in ("live", "sim")},
        }
        save(args, result)


def save(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.append_to:
        full = json.loads(args.out.read_text())
        full.setdefault("checks", {})[args.append_to] = result
        result = full
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", flush=True)


def print_row(policy: str, row: dict[str, Any]) -> None:
    def fmt(side: str) -> str:
        s, m = row[side]["summary"], row[side]["meets"]
        flags = "".join(k[0].upper() if m[k] else "-" for k in ("goodput", "tail_p99", "token"))
        return (f"good {s['goodput_share']:.2f} tok {s['token_criterion_share']:.2f} "
                f"ttft {1e3 * s['ttft_p50']:.0f}/{1e3 * s['ttft_p99']:.0f} ms "
                f"p99gap {1e3 * s['tbt_token_p99']:.1f} ms it {row[side]['iterations']} [{flags}]")
    ex = row["live"]["execution"]
    print(f"{policy:9s} {row['qps']:5.1f}  live {fmt('live')}  |  sim {fmt('sim')}  | "
          f"exec/pred {ex['ratio_serving']:.2f} ovh p50 {row['live']['overhead_p50_ms']:.2f} ms",
          file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
