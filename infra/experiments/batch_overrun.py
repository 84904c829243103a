"""Issue 14: how much longer the live sim backend's batches run than the ground truth says.

The sim executor waits out each batch's ground-truth time (``executor/server.py``,
``_wait_until``) and reports what it measured, wait overshoot included; the overhead
profile times only the gaps *between* batches, so the overshoot is modelled nowhere.

    PYTHONPATH=shared:services python infra/experiments/batch_overrun.py live [N] [QPS]
    PYTHONPATH=shared:services python infra/experiments/batch_overrun.py sim SCALE [LOAD]

``live``: an Ascendra 2L1H stack (sim backend, real Redis), ``bench`` of N ShareGPT
requests (seed 4) at QPS, then every batch in the stack's samples stream (what the perf
model learns from) against the ground truth's noiseless time for its shape: per source
(``sweep``: the executors' warm-up, which does not wait; ``run``: served batches) the
ratio's mean and median, sum over sum, and the excess in ms. ``sim``: the live-vs-sim
table's best predictor (calibration profile, refit every 1 s, median of 16 noise draws)
at LOAD x 9.5 req/s, with every ground-truth batch time x SCALE, to see what an overrun
of that size moves. Results: docs/lab/live-stack.md, "The sim backend's batches overrun".
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CAPACITY = 9.5  # Ascendra 2L1H, ShareGPT, 600 requests, seed 4 (docs/lab/live-stack.md)
CALIBRATION = (ROOT / "docs/results/live_vs_sim_n600_replay_fasthost"
               / "ascendra-calibration.profile.json")
KEYS = ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99")


def live(n: int, qps: float, policy: str = "ascendra", instances: int = 3,
         hp_instances: int = 1) -> dict[str, Any]:
    import redis

    from sloserve.perf.ground_truth import ProfileTiming
    from sloserve.services.auth import new_token
    from sloserve.services.perfmodel.samples import decode
    from sloserve.services.stack import Stack, StackConfig
    from sloserve.services.store import Keys

    os.environ["SLOSERVE_INTERNAL_TOKEN"] = new_token()
    prefix = f"sloserve:overrun{os.getpid()}"
    cfg = StackConfig(policy=policy, instances=instances, hp_instances=hp_instances, seed=0,
                      prefix=prefix,
                      gateway_port=22000 + os.getpid() % 1000, redis_url=REDIS_URL,
                      log_dir=Path(tempfile.mkdtemp(prefix="overrun-")))
    load_before = os.getloadavg()
    with Stack(cfg) as stack:
        r = subprocess.run(
            [sys.executable, "-m", "sloserve.services.cli", "bench", "--target", stack.gateway,
             "--trace", "sharegpt", "--num-requests", str(n), "--qps", str(qps), "--seed", "4",
             "--json", "--disable-tqdm"], capture_output=True, text=True, check=False)
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       redis.Redis.from_url(REDIS_URL).xrange(Keys(prefix).samples))
    bench = json.loads(r.stdout.strip().splitlines()[-1])
    truth = ProfileTiming("llama-3-8b", "a100", noise_cv=0.0)
    pairs: dict[str, list[tuple[float, float]]] = {}
    for _, fields in entries:
        s = decode(fields)
        pairs.setdefault(fields[b"src"].decode(), []).append(
            (s.duration, truth.noiseless_time(s.shape)))
    out: dict[str, Any] = {"bench": {k: bench.get(k) for k in (*KEYS, "completed", "offloads")},
                           "load_avg_before": load_before, "load_avg_after": os.getloadavg()}
    for src, p in pairs.items():
        t, ref = np.array(p).T
        ex = (t - ref) * 1e3
        out[src] = {"batches": len(t), "ratio_mean": float((t / ref).mean()),
                    "ratio_median": float(np.median(t / ref)),
                    "sum_over_sum": float(t.sum() / ref.sum()),
                    "excess_ms_mean": float(ex.mean()), "excess_ms_median": float(np.median(ex)),
                    "excess_ms_p10": float(np.percentile(ex, 10)),
                    "excess_ms_p90": float(np.percentile(ex, 90)),
                    "truth_ms_mean": float(ref.mean() * 1e3)}
    return out


def sim(scale: float, load: float) -> dict[str, Any]:
    from sloserve.perf import ground_truth
    from sloserve.services.cli import main

    batch_time = ground_truth.ProfileTiming.batch_time

    def scaled(self: ground_truth.ProfileTiming, shape: Any) -> float:
        return batch_time(self, shape) * scale

    ground_truth.ProfileTiming.batch_time = scaled  # type: ignore[method-assign]
    argv = ["simulate", "--policy", "ascendra", "--instances", "3", "--hp-instances", "1",
            "--trace", "sharegpt", "--num-requests", "600", "--qps", f"{load * CAPACITY:.4f}",
            "--seed", "4", "--admission", "--json", "--noise-draws", "16", "--overlap",
            "--refit-interval", "1", "--noise-streams", "instance", "--noise-seed", "0",
            "--overhead-profile", str(CALIBRATION)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        main(argv)
    res = json.loads(buf.getvalue().strip().splitlines()[-1])
    return {"scale": scale, "load": load, **{k: res.get(k) for k in (*KEYS, "offloads")}}


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "live":
        result = live(int(rest[0]) if rest else 400, float(rest[1]) if len(rest) > 1 else 6.6)
    else:
        result = sim(float(rest[0]), float(rest[1]) if len(rest) > 1 else 0.7)
    print(json.dumps(result, indent=1))
