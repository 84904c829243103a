"""Frontend CPU per delivered token (issue 33, item 3): our gRPC and OpenAI HTTP/SSE paths
against stock ``vllm serve``'s API server, same request count and lengths, one run.

* ``grpc``, ``http``: one sim-backend stack (``Stack``, Redis from ``$REDIS_URL``); one
  ``sloserve bench`` through the SDK, then one ``sloserve bench --endpoint openai``
  (streamed ``/v1/completions``). The frontend CPU is utime + stime from ``/proc`` of
  every frontend process the stack started (found by pid, with its children, not by
  name: other stacks run on this machine), before and after each bench.
* ``vllm``: stock ``vllm serve`` (SmolLM2-135M, CPU build) and the same
  ``bench --endpoint openai``. vLLM runs its API server and its engine core as separate
  processes; only the API server's process (the one started, not its engine-core
  child) is counted.

Every request has ``--input-len`` prompt and exactly ``--output-len`` output tokens
(``ignore_eos``); the tokens counted are the ones the bench received. One JSON line
per path, with the 1-minute load average before and after.

    PYTHONPATH=shared:services python infra/bench/token_path.py --num-requests 300 \\
        --output-len 256 --paths grpc http vllm
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VLLM_MODEL = "smollm2-135m"
VLLM_START_S = 900.0
STACK_START_S = 600.0


def bench(
    target: str,
    endpoint: str,
    args: argparse.Namespace,
    trace: Path,
    env: dict[str, str],
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One ``sloserve bench`` run's JSON result."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sloserve.services.cli",
            "bench",
            "--endpoint",
            endpoint,
            "--target",
            target,
            "--trace-file",
            str(trace),
            "--sample",
            "ordered",
            "--num-requests",
            str(args.num_requests),
            "--qps",
            str(args.qps),
            "--seed",
            "0",
            "--json",
            "--disable-tqdm",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode != 0:
        raise RuntimeError(f"bench --endpoint {endpoint} failed: {r.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def measured(
    path: str, cpu: Callable[[], dict[str, float]], run: Callable[[], dict[str, Any]], note: str
) -> dict[str, Any]:
    """Run ``run`` (a bench) between two reads of ``cpu`` (per-process CPU seconds)."""
    load0, before, t0 = os.getloadavg()[0], cpu(), time.time()
    res = run()
    wall, after = time.time() - t0, cpu()
    per = {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
    total = sum(per.values())
    tokens = int(res["total_output_tokens"])
    return {
        "path": path,
        "frontend_cpu_us_per_token": round(total / max(tokens, 1) * 1e6, 1),
        "frontend_cpu_s": round(total, 2),
        "processes": per,
        "delivered_tokens": tokens,
        "completed": res.get("completed"),
        "wall_s": round(wall, 1),
        "frontend_cpu_share_of_wall": round(total / wall, 3),
        "load_before": round(load0, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "tpot_ms_p50": res.get("median_tpot_ms"),
        "note": note,
    }


def run_stack(args: argparse.Namespace, trace: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    from sloserve.services.auth import new_token
    from sloserve.services.proc_cpu import is_frontend, services_cpu_s, stack_pids
    from sloserve.services.stack import Stack, StackConfig

    os.environ["SLOSERVE_INTERNAL_TOKEN"] = new_token()
    cfg = StackConfig(
        policy=args.policy,
        instances=args.instances,
        model=args.model,
        gpu=args.gpu,
        gateway_port=args.port,
        http_port=args.port + 1,
        stream_interval=args.stream_interval,
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        log_dir=Path(tempfile.mkdtemp(prefix="token-path-")),
    )
    out = []
    stack = Stack(cfg)
    stack.start(timeout=STACK_START_S)  # a busy shared machine starts slowly
    try:
        time.sleep(3)  # past the start-up imports
        pids = {k: v for k, v in stack_pids(stack).items() if is_frontend(k)}

        def cpu() -> dict[str, float]:
            return services_cpu_s(pids)

        note = (
            f"sim {args.model}/{args.gpu}, {args.instances} instances, {args.policy}, "
            f"stream interval {args.stream_interval}"
        )
        if "grpc" in args.paths:
            out.append(
                measured("grpc", cpu, lambda: bench(stack.gateway, "grpc", args, trace, env), note)
            )
            print(json.dumps(out[-1]), flush=True)
        if "http" in args.paths:
            out.append(
                measured(
                    "http",
                    cpu,
                    lambda: bench(
                        stack.http,
                        "openai",
                        args,
                        trace,
                        env,
                        ("--model", args.model, "--workload-model", args.model),
                    ),
                    note,
                )
            )
            print(json.dumps(out[-1]), flush=True)
    finally:
        stack.stop()
    return out


def run_vllm(
    args: argparse.Namespace, trace: Path, env: dict[str, str], logs: Path
) -> dict[str, Any]:
    """Stock ``vllm serve`` on SmolLM2: its API server process's CPU over the bench."""
    import httpx

    from sloserve.services.model_store import resolve
    from sloserve.services.proc_cpu import cpu_s

    port = args.port + 2
    log = (logs / "vllm-serve.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(resolve(VLLM_MODEL)),
            "--served-model-name",
            VLLM_MODEL,
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--kv-cache-memory-bytes",
            str(1 << 30),
            "--seed",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    target, t0 = f"http://127.0.0.1:{port}", time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited: see {log.name}")
            if time.monotonic() - t0 > VLLM_START_S:
                raise RuntimeError(f"vllm serve not ready in {VLLM_START_S:.0f} s: {log.name}")
            try:
                if httpx.get(f"{target}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        time.sleep(3)
        res = measured(
            "stock",
            lambda: {"vllm-api-server": cpu_s(proc.pid)},
            lambda: bench(
                target,
                "openai",
                args,
                trace,
                env,
                ("--model", VLLM_MODEL, "--workload-model", VLLM_MODEL),
            ),
            "stock vllm serve, SmolLM2-135M CPU: the API-server process only "
            "(its engine core runs in a child process, not counted)",
        )
        print(json.dumps(res), flush=True)
        return res
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--paths", nargs="+", choices=("grpc", "http", "stock"), default=["grpc", "http", "stock"]
    )
    p.add_argument("--policy", default="sarathi")
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--model", default="llama-2-7b", help="the sim stack's model timing")
    p.add_argument("--gpu", default="h100", help="the sim stack's hardware timing")
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="the sim stack's gateway --stream-interval (vLLM's stream_interval)",
    )
    p.add_argument("--qps", type=float, default=4.0)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--port", type=int, default=23100, help="gRPC port; HTTP is +1, vllm serve +2")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT / 'services'}")
    with tempfile.TemporaryDirectory(prefix="token-path-") as tmp:
        d = Path(tmp)
        trace = d / "trace.csv"
        with trace.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["prompt_tokens", "output_tokens"])
            w.writerows([[args.input_len, args.output_len]] * args.num_requests)
        rows = run_stack(args, trace, env) if {"grpc", "http"} & set(args.paths) else []
        if "stock" in args.paths:  # stock vllm serve
            rows.append(run_vllm(args, trace, env, Path(tempfile.mkdtemp(prefix="token-path-"))))
    fig = {r["path"]: r["frontend_cpu_us_per_token"] for r in rows}
    if "stock" in fig:  # stock vllm serve's API server over ours
        fig.update(
            {
                f"stock_over_{k}": round(fig["stock"] / v, 2)
                for k, v in list(fig.items())
                if k != "stock" and v > 0
            }
        )
    print(json.dumps({"summary_cpu_us_per_token": fig, "args": vars(args)}), flush=True)


if __name__ == "__main__":
    main()
