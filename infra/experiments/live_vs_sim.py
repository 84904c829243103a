"""Issue 14, acceptance: live vs simulate at 50/70/90 % of capacity, sim backend.

Two deployments (sarathi, one instance; ascendra 2L1H = ``up --policy ascendra
--instances 3 --hp-instances 1``) x three loads = six runs, four latency metrics
each (TTFT and TBT P50/P99): the twelve-row table of ``docs/lab/live-stack.md``.

Workload: ShareGPT, llama-3-8b on the a100 sim ground truth, 200 requests, seed 4
(the issue's measurement). Capacity: ``sloserve capacity`` for the same
deployment and workload (goodput criterion, share >= 0.9), computed by the
simulator; load x of capacity is ``--qps x * capacity``.

Each run: a fresh stack (real Redis, a random key prefix) + ``sloserve bench
--compare-sim --overhead-out`` under the measurement lock (``flock`` on
``/tmp/notes/measure.lock``, normal priority, one run at a time, released
between runs); ``uptime`` before and after. ``--compare-sim`` gives the
simulation without an overhead profile (in the bench process, after the run).
Afterwards, at ``nice 19`` and outside the lock, ``simulate`` runs the same
workload with overhead profiles: the run's own (``--overhead-out``) and, with
``calibrate``, one measured per deployment at 60 % load with another seed (5).

    PYTHONPATH=shared:services python infra/experiments/live_vs_sim.py capacity
    PYTHONPATH=shared:services python infra/experiments/live_vs_sim.py calibrate
    PYTHONPATH=shared:services python infra/experiments/live_vs_sim.py live [CELL ...]
    PYTHONPATH=shared:services python infra/experiments/live_vs_sim.py table

CELL is ``sarathi:0.5`` etc. (default: all six). Raw per-run files go to
``docs/results/live_vs_sim/``, the table to ``docs/results/live_vs_sim.json``.
``--num-requests N`` (default 200) runs N requests per run instead, with its own
capacity, raw files (``live_vs_sim_nN/``) and table (``live_vs_sim_nN.json``): a P99
over 200 requests is their second-highest value, the simulation's own noise floor.

``--noise replay`` (the default since 2026-11-26): the simulations draw the ground truth's
noise from the streams the stack's executors draw (``--noise-streams instance
--noise-seed 0``, as ``bench --compare-sim`` now does), so live and simulated batches
get the same noise factors; files end ``_replay``. ``--noise run`` is how every table
before it was made: one stream seeded by the workload's seed 4, while the executors
drew theirs from seeds 0, 1, 2 (different draws on every instance).

The ``+refit1s`` columns (2026-11-26, fifth session): ``simulate --refit-interval 1``, the
online perf model refit every second of simulated time as `up`'s perf-model service does
(``bench --compare-sim`` now does the same), instead of every 512 batches. The
``+controller_lag`` column adds ``simulate --controller-lag``: the instances' reports (first
tokens, queue states) reach the controller after the profile's measured delivery lag.

The ``+draws16`` columns (2026-11-26, fourth session): ``simulate --noise-draws 16``, the
median of 16 simulations whose ground-truth noise seeds are 0..15 (draw 0 is the replayed
one), with each metric's range over the draws (``noise_band``): one draw of a chaotic
policy's tail is one sample of the simulator's spread, not its prediction.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "docs" / "results" / "live_vs_sim"
OUT = ROOT / "docs" / "results" / "live_vs_sim.json"
LOCK = "/tmp/notes/measure.lock"
DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "sarathi": {"policy": "sarathi", "instances": 1, "hp_instances": 0},
    "ascendra": {"policy": "ascendra", "instances": 3, "hp_instances": 1},
}
LOADS = (0.5, 0.7, 0.9)
CALIBRATION_LOAD, CALIBRATION_SEED = 0.6, 5
WORKLOAD = ["--trace", "sharegpt", "--num-requests", "200"]
SEED = 4
STACK_SEED = 0  # `up --seed`: executor k draws its noise from stream_seed(0, k)
REPLAY = True  # simulate draws the executors' noise (--noise run: one stream seeded SEED)
DRAWS = 16  # the +drawsN columns: median over N noise draws (draw 0 is the replayed one)
REFIT = 1.0  # the +refitSs columns: the perf model refit every S s, as `up`'s (its default)
METRICS = ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99")
CLI = [sys.executable, "-m", "sloserve.services.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT / 'shared'}:{ROOT / 'services'}"
    return env


def _flags(dep: str) -> list[str]:
    d = DEPLOYMENTS[dep]
    return ["--policy", d["policy"], "--instances", str(d["instances"]),
            "--hp-instances", str(d["hp_instances"])]


def _nice(argv: list[str]) -> dict[str, Any]:
    """A CLI command at nice 19; its JSON stdout."""
    r = subprocess.run(["nice", "-n", "19", *argv], capture_output=True, text=True, env=_env(),
                       check=True)
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def _load() -> dict[str, Any]:
    return json.loads(OUT.read_text()) if OUT.exists() else {}


def _save(data: dict[str, Any]) -> None:
    OUT.write_text(json.dumps(data, indent=1) + "\n")


def capacity() -> dict[str, float]:
    data = _load()
    caps: dict[str, float] = data.get("capacity_qps", {})
    for dep in DEPLOYMENTS:
        if dep not in caps:
            out = _nice([*CLI, "capacity", *_flags(dep), *WORKLOAD, "--seed", str(SEED),
                         "--json"])
            caps[dep] = float(out["capacity_qps"])
    data["capacity_qps"] = caps
    data["capacity_note"] = ("sloserve capacity (goodput criterion, share >= 0.9), ShareGPT, "
                             f"{WORKLOAD[-1]} requests, seed 4, llama-3-8b on a100, default "
                             "SLOs")
    _save(data)
    return caps


@contextlib.contextmanager
def measurement_lock() -> Iterator[dict[str, Any]]:
    """``flock /tmp/notes/measure.lock`` for one run; uptime before/after (recorded)."""
    note: dict[str, Any] = {}
    with open(LOCK, "a") as fh:
        t0 = time.time()
        fcntl.flock(fh, fcntl.LOCK_EX)
        note["lock_wait_s"] = round(time.time() - t0, 1)
        note["uptime_before"] = subprocess.run(["uptime"], capture_output=True,
                                               text=True).stdout.strip()
        try:
            yield note
        finally:
            note["uptime_after"] = subprocess.run(["uptime"], capture_output=True,
                                                  text=True).stdout.strip()
            fcntl.flock(fh, fcntl.LOCK_UN)


def live_run(dep: str, qps: float, seed: int, name: str) -> dict[str, Any]:
    """One stack + bench under the lock; writes RAW/<name>.json (+ profile, result file)."""
    from sloserve.services.auth import new_token
    from sloserve.services.stack import Stack, StackConfig

    RAW.mkdir(parents=True, exist_ok=True)
    d = DEPLOYMENTS[dep]
    os.environ["SLOSERVE_INTERNAL_TOKEN"] = new_token()  # the stack's and bench's
    profile = RAW / f"{name}.profile.json"
    cfg = StackConfig(policy=d["policy"], instances=d["instances"],
                      hp_instances=d["hp_instances"], seed=STACK_SEED,
                      gateway_port=21000 + (os.getpid() + int(qps * 100)) % 1000,
                      redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                      log_dir=Path(tempfile.mkdtemp(prefix="h14a-lvs-")))
    with measurement_lock() as note:
        with Stack(cfg) as stack:
            r = subprocess.run(
                [*CLI, "bench", "--target", stack.gateway, *WORKLOAD, "--qps", f"{qps:.4f}",
                 "--seed", str(seed), "--json", "--disable-tqdm", "--compare-sim",
                 "--overhead-out", str(profile)],
                capture_output=True, text=True, env=_env())
    if r.returncode not in (0, 1):
        raise RuntimeError(f"bench failed ({r.returncode}): {r.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    out["measurement"] = note
    out["overhead_profile_file"] = str(profile.relative_to(ROOT))
    (RAW / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(name, json.dumps({k: out[k] for k in ("completed", "dropped", *METRICS)}),
          note, flush=True)
    return out


def calibrate() -> None:
    caps = capacity()
    for dep in DEPLOYMENTS:
        live_run(dep, CALIBRATION_LOAD * caps[dep], CALIBRATION_SEED, f"{dep}-calibration")


def live(cells: list[str]) -> None:
    caps = capacity()
    for cell in cells:
        dep, load = cell.split(":")
        live_run(dep, float(load) * caps[dep], SEED, f"{dep}-{float(load):g}")


def simulate(dep: str, qps: float, profile: str | None, overlap: bool,
             draws: int = 1, refit: float | None = None, lag: bool = False) -> dict[str, Any]:
    argv = [*CLI, "simulate", *_flags(dep), *WORKLOAD, "--qps", f"{qps:.4f}",
            "--seed", str(SEED), "--admission", "--json", "--noise-draws", str(draws)] + (
                ["--overlap"] if overlap else []) + (
                ["--refit-interval", f"{refit:g}"] if refit else []) + (
                ["--controller-lag"] if lag else [])
    if REPLAY:  # the stack's executors' own noise streams (bench --compare-sim does the same)
        argv += ["--noise-streams", "instance", "--noise-seed", str(STACK_SEED)]
    if profile:
        argv += ["--overhead-profile", str(ROOT / profile)]
    return _nice(argv)


def _within(diff: float | None) -> bool:
    """Within the 5 % bar (an undefined difference is not)."""
    return diff is not None and abs(diff) <= 0.05


def table() -> None:
    from sloserve.services.compare_sim import differences
    from sloserve.sim.overhead import OverheadProfile

    data = _load()
    caps = data["capacity_qps"]
    rows = []
    for dep in DEPLOYMENTS:
        calib = RAW / f"{dep}-calibration.profile.json"
        for load, run in [(x, r) for x in LOADS for r in ("", ".run1", ".run2")]:
            raw = RAW / f"{dep}-{load:g}{run}.json"  # .runK: an earlier run kept beside a repeat
            if not raw.exists():
                continue
            live_out = json.loads(raw.read_text())
            qps = load * caps[dep]
            own_file = live_out["overhead_profile_file"]
            # column: (overlap, profile, noise draws, refit interval, controller lag)
            variants: dict[str, tuple[bool, str | None, int, float | None, bool]] = {
                "serial": (False, None, 1, None, False), "overlap": (True, None, 1, None, False),
                "overlap+own_profile": (True, own_file, 1, None, False),
                f"overlap+draws{DRAWS}": (True, None, DRAWS, None, False),
                f"overlap+refit{REFIT:g}s+draws{DRAWS}": (True, None, DRAWS, REFIT, False)}
            if calib.exists():
                calib_file = str(calib.relative_to(ROOT))
                cal = "overlap+calibration_profile"
                variants[cal] = (True, calib_file, 1, None, False)
                variants[f"{cal}+draws{DRAWS}"] = (True, calib_file, DRAWS, None, False)
                variants[f"{cal}+refit{REFIT:g}s"] = (True, calib_file, 1, REFIT, False)
                variants[f"{cal}+refit{REFIT:g}s+draws{DRAWS}"] = (
                    True, calib_file, DRAWS, REFIT, False)
                variants[f"{cal}+refit{REFIT:g}s+controller_lag+draws{DRAWS}"] = (
                    True, calib_file, DRAWS, REFIT, True)
            sims = {}
            for v, (overlap, prof, draws, refit, lag) in variants.items():
                sim = simulate(dep, qps, prof, overlap, draws, refit, lag)
                sims[v] = {"metrics": differences(live_out, sim), "overlap": overlap,
                           "iterations": sim["iterations"], "profile": prof,
                           "offloads": sim.get("offloads")}
                if "noise_draws" in sim:  # the simulator's own band for each metric
                    sims[v]["noise_band"] = {m: sim["noise_draws"]["range"].get(m)
                                             for m in (*METRICS, "offloads")}
            own = OverheadProfile.load(ROOT / live_out["overhead_profile_file"])
            cmp = live_out.get("compare_sim", {})
            replayed = cmp.get("replayed_arrivals")
            if replayed:  # bench's own simulation (overlap, no profile), arrivals as stamped
                sims["overlap+live_arrivals"] = {"metrics": replayed["metrics"], "overlap": True,
                                                 "iterations": None, "profile": None}
            rows.append({
                "deployment": dep, "load": load, "qps": qps,
                "run": "latest" if not run else run[4:],
                "live": {k: live_out.get(k) for k in (*METRICS, "goodput_share", "completed",
                                                      "dropped", "throughput_tok_s",
                                                      "offloads")},
                "sim": sims,
                "within_5pct": {v: {m: _within(x["metrics"][m]["diff"]) for m in METRICS}
                                for v, x in sims.items()},
                "live_iterations": cmp.get("live_iterations"),
                "unhidden_own_profile_ms": {"count": len(own.samples_s),
                                            "mean": own.mean_s * 1e3,
                                            "p50": own.percentile(50) * 1e3,
                                            "p99": own.percentile(99) * 1e3},
                "arrival_lag_ms": [cmp.get("arrival_lag_p50_ms"), cmp.get("arrival_lag_p99_ms")],
                "delivery_lag_ms": [cmp.get("delivery_lag_p50_ms"),
                                    cmp.get("delivery_lag_p99_ms")],
                # tokens at the instance's iteration end instead of the gateway's emit,
                # against bench --compare-sim's simulation (overlap, no profile)
                "instance_side": cmp.get("instance_side_metrics"),
                # the same on the instances' clock, against the live-arrivals simulation
                "instance_side_live_arrivals": (replayed or {}).get("instance_side_metrics"),
                "measurement": live_out["measurement"],
            })
            for v, x in sims.items():
                print(dep, load, run, v, {m: round(x["metrics"][m]["diff"] * 100, 1)
                                     for m in METRICS}, flush=True)
    data["rows"] = rows
    data["workload"] = (f"ShareGPT, {WORKLOAD[-1]} requests, seed 4, Poisson arrivals, "
                        "default SLOs (TTFT 1 s, TBT 0.15 s), llama-3-8b on a100 sim ground truth "
                        "(noise CV 0.03); live: fresh `up`-equivalent stack per run, real "
                        "Redis, overlap on (default)")
    _save(data)


def noise(seeds: int = 10) -> None:
    """How much the simulation itself moves when only the ground truth's run-to-run noise
    draws change (same workload, same config, overlap on): the live executor draws its noise
    with another seed than ``simulate`` (the stack's, 0), so this spread is the floor any
    live-vs-sim difference of one 200-request run sits on. Run it at nice 19."""
    import dataclasses

    import numpy as np

    from sloserve.admission import Admission
    from sloserve.perf.ground_truth import ProfileTiming
    from sloserve.sim.config import SimConfig
    from sloserve.sim.simulator import simulate as run_sim

    data = _load()
    caps = data["capacity_qps"]
    spread = {}
    for dep, d in DEPLOYMENTS.items():
        for load in LOADS:
            base = SimConfig(policy=d["policy"], instances=d["instances"],
                             hp_instances=d["hp_instances"], trace="sharegpt",
                             num_requests=int(WORKLOAD[-1]), seed=SEED,
                             qps=round(load * caps[dep], 4),
                             admission=Admission(), overlap=True)
            vals: dict[str, list[float]] = {m: [] for m in METRICS}
            for k in range(seeds):
                out = run_sim(dataclasses.replace(
                    base, noise_seed=1000 + k, noise_streams="instance") if REPLAY else
                    dataclasses.replace(
                    base, timing=ProfileTiming("llama-3-8b", "a100", seed=1000 + k)))
                for m in METRICS:
                    vals[m].append(out[m])
            row: dict[str, dict[str, Any]] = {}
            for m, xs in vals.items():
                a = np.array(xs)
                row[m] = {"mean_ms": float(a.mean() * 1e3),
                          "rel_std": float(a.std() / a.mean()),
                          "rel_range": [float(a.min() / a.mean() - 1),
                                        float(a.max() / a.mean() - 1)]}
            spread[f"{dep}-{load:g}"] = row
            print(dep, load, {m: f"sd {v['rel_std'] * 100:.1f}% range "
                                 f"{v['rel_range'][0] * 100:+.1f}..{v['rel_range'][1] * 100:+.1f}%"
                              for m, v in row.items()}, flush=True)
    data["noise_floor"] = {"seeds": seeds, "note": (
        "simulate (overlap, admission, no profile) with only the ground truth's noise seed "
        "changed (1000..); relative std and range of each metric"), "cells": spread}
    _save(data)


def markdown() -> None:
    """The docs table: one row per (deployment, load, metric), every simulation variant."""
    data = _load()
    variants = ("serial", "overlap", "overlap+own_profile", "overlap+calibration_profile",
                "overlap+live_arrivals", f"overlap+draws{DRAWS}",
                f"overlap+calibration_profile+draws{DRAWS}",
                f"overlap+refit{REFIT:g}s+draws{DRAWS}",
                f"overlap+calibration_profile+refit{REFIT:g}s",
                f"overlap+calibration_profile+refit{REFIT:g}s+draws{DRAWS}",
                f"overlap+calibration_profile+refit{REFIT:g}s+controller_lag+draws{DRAWS}")
    names = {"ttft_p50": "TTFT P50", "ttft_p99": "TTFT P99", "tbt_p50": "TBT P50",
             "tbt_p99": "TBT P99"}
    print("| deployment | load (req/s) | metric | live | " + " | ".join(
        f"sim {v}" for v in variants) + " | instance-side live vs overlap | instance-side "
        "live vs overlap+live_arrivals |")
    print("|---" * (6 + len(variants)) + "|")
    for r in data["rows"]:
        for m in METRICS:
            cells = []
            for v in variants:
                x = r["sim"].get(v)
                if x is None:
                    cells.append("-")
                    continue
                mm = x["metrics"][m]
                mark = "" if abs(mm["diff"]) <= 0.05 else "**"
                cells.append(f"{mm['sim'] * 1e3:.1f} ms ({mark}{mm['diff'] * 100:+.1f}%{mark})")
            sides = []
            for key in ("instance_side", "instance_side_live_arrivals"):
                side = r.get(key)
                sides.append(f"{side[m]['live'] * 1e3:.1f} ms ({side[m]['diff'] * 100:+.1f}%)"
                             if side else "-")
            tag = f" (run {r['run']})" if r.get("run") != "latest" else ""
            print(f"| {r['deployment']}{tag} | {r['load']:g} x ({r['qps']:.1f}) | {names[m]} | "
                  f"{r['live'][m] * 1e3:.1f} ms | " + " | ".join(cells) + " | "
                  + " | ".join(sides) + " |")


def use_num_requests(n: int, noise: str, tag: str = "") -> None:
    """Point the workload, the raw files and the table at ``n`` requests per run, and at
    the noise mode: ``replay`` files end ``_replay`` (the tables before it were ``run``);
    ``tag``: a set of runs of its own (``_<tag>`` last)."""
    global RAW, OUT, REPLAY
    REPLAY = noise == "replay"
    stem = ("live_vs_sim" + (f"_n{n}" if n != 200 else "") + ("_replay" if REPLAY else "")
            + (f"_{tag}" if tag else ""))
    WORKLOAD[-1] = str(n)
    RAW = ROOT / "docs" / "results" / stem
    OUT = ROOT / "docs" / "results" / f"{stem}.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--noise", choices=("replay", "run"), default="replay",
                   help="replay: simulate draws the live executors' noise streams (default); "
                        "run: one stream seeded by the workload seed (the tables before "
                        "2026-11-26's replay)")
    p.add_argument("--tag", default="", help="keep these runs apart: files end _TAG")
    p.add_argument("phase", choices=("capacity", "calibrate", "live", "table", "markdown",
                                          "noise"))
    p.add_argument("cells", nargs="*", default=[f"{d}:{x:g}" for d in DEPLOYMENTS for x in LOADS])
    args = p.parse_args()
    use_num_requests(args.num_requests, args.noise, args.tag)
    if args.phase == "capacity":
        print(capacity())
    elif args.phase == "calibrate":
        calibrate()
    elif args.phase == "live":
        live(args.cells)
    elif args.phase == "markdown":
        markdown()
    elif args.phase == "noise":
        noise()
    else:
        table()


if __name__ == "__main__":
    main()
