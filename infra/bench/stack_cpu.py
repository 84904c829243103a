"""CPU seconds per service of a live sim stack during one ``bench`` run (issue 14 evidence).

Starts a stack (``Stack``, real Redis from ``$REDIS_URL``), reads every service's
utime + stime from ``/proc`` before and after one ``sloserve bench`` against it, and
prints one JSON line: per service (``gateway``, ``scheduler-<id>``, ``executor-<id>``,
``perfmodel``) and the bench client, with the run's wall time and latency figures.
Services are this stack's own processes, by the pids it started (``proc_cpu``), not by
name: other stacks on the machine run the same services.

    PYTHONPATH=shared:services python infra/bench/stack_cpu.py --policy ascendra \\
        --instances 3 --hp-instances 1 --qps 8.55 --num-requests 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    from sloserve.services.auth import new_token
    from sloserve.services.proc_cpu import services_cpu_s, stack_pids
    from sloserve.services.stack import Stack, StackConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="ascendra")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--hp-instances", type=int, default=1)
    p.add_argument("--qps", type=float, default=8.55)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--port", type=int, default=21777)
    args = p.parse_args()
    os.environ["SLOSERVE_INTERNAL_TOKEN"] = new_token()
    cfg = StackConfig(policy=args.policy, instances=args.instances,
                      hp_instances=args.hp_instances, gateway_port=args.port,
                      redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                      log_dir=Path(tempfile.mkdtemp(prefix="stack-cpu-")))
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT / 'services'}")
    load_before = os.getloadavg()[0]
    with Stack(cfg) as stack:
        time.sleep(3)  # past the start-up imports
        pids = stack_pids(stack)  # this stack's own processes (others run on the machine)
        before, t0, c0 = services_cpu_s(pids), time.time(), os.times()
        r = subprocess.run(
            [sys.executable, "-m", "sloserve.services.cli", "bench", "--target", stack.gateway,
             "--trace", "sharegpt", "--num-requests", str(args.num_requests),
             "--qps", str(args.qps), "--seed", str(args.seed), "--json", "--disable-tqdm"],
            capture_output=True, text=True, env=env, check=True)
        wall, c1, after = time.time() - t0, os.times(), services_cpu_s(pids)
    bench = json.loads(r.stdout.strip().splitlines()[-1])
    cpu = {k: round(after[k] - before.get(k, 0.0), 2) for k in sorted(after)}
    cpu["bench"] = round(c1.children_user + c1.children_system
                         - c0.children_user - c0.children_system, 2)
    tokens = bench["throughput_tok_s"] * bench["duration"]
    print(json.dumps({
        "args": vars(args), "wall_s": round(wall, 1), "cpu_s": cpu,
        "cpu_total_s": round(sum(cpu.values()), 1), "output_tokens": round(tokens),
        "cpu_us_per_token": {k: round(v / tokens * 1e6) for k, v in cpu.items()},
        "load_before": load_before, "load_after": os.getloadavg()[0],
        "latency_ms": {k: round(bench[k] * 1e3, 1)
                       for k in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99")}}))


if __name__ == "__main__":
    main()
