"""TLS cost at the front door (issue 34 acceptance): the gateway's CPU per output token
with and without TLS, over one ``sloserve bench`` (sim backend) per mode.

Modes: ``plain`` (no TLS), ``tls`` (gRPC + HTTPS with ``--tls-cert/--tls-key``, the
bench's SDK trusting the CA through ``$SLOSERVE_TLS_CA``), ``tls+mtls`` (also mutual TLS
on the internal plane, whose client side the gateway pays too). Certificates come from
``trustme``; Redis is ``$REDIS_URL``. The stack's own gateway process's utime + stime
from ``/proc`` before and after the bench; one JSON line per mode.

    PYTHONPATH=shared:services python infra/bench/tls_cost.py --num-requests 300 \\
        --output-len 256 --qps 4
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]



def make_pki(d: Path) -> None:
    """``public/`` (CA + gateway) and ``internal/`` (CA + one cert per service kind)."""
    import trustme

    for sub, names in (("public", ("gateway",)),
                       ("internal", ("gateway", "scheduler", "executor", "perfmodel"))):
        (d / sub).mkdir(parents=True)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(d / sub / "ca.pem"))
        for n in names:
            cert = ca.issue_cert("127.0.0.1", "localhost", common_name=n)
            cert.cert_chain_pems[0].write_to_path(str(d / sub / f"{n}.pem"))
            cert.private_key_pem.write_to_path(str(d / sub / f"{n}-key.pem"))


def run_mode(mode: str, args: argparse.Namespace, pki: Path, trace: Path) -> dict[str, object]:
    from sloserve.services.proc_cpu import cpu_s
    from sloserve.services.stack import Stack, StackConfig

    tls = mode != "plain"
    pub = pki / "public"
    cfg = StackConfig(
        policy=args.policy, instances=args.instances, gateway_port=args.port,
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        log_dir=Path(tempfile.mkdtemp(prefix=f"tls-cost-{mode}-")),
        tls_cert=str(pub / "gateway.pem") if tls else None,
        tls_key=str(pub / "gateway-key.pem") if tls else None,
        tls_ca=str(pub / "ca.pem") if tls else None,
        tls_internal_dir=str(pki / "internal") if mode == "tls+mtls" else None)
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT / 'services'}")
    env.pop("SLOSERVE_TLS_CA", None)
    if tls:
        env["SLOSERVE_TLS_CA"] = str(pub / "ca.pem")
    load_before = os.getloadavg()
    with Stack(cfg) as stack:
        time.sleep(3)  # past the start-up imports
        gw_proc = stack.services["gateway"].proc
        assert gw_proc is not None
        before, t0 = cpu_s(gw_proc.pid), time.time()
        r = subprocess.run(
            [sys.executable, "-m", "sloserve.services.cli", "bench", "--target", stack.gateway,
             "--trace-file", str(trace), "--sample", "ordered",
             "--num-requests", str(args.num_requests), "--qps", str(args.qps),
             "--seed", "0", "--json", "--disable-tqdm"],
            capture_output=True, text=True, env=env, check=True)
        wall, after = time.time() - t0, cpu_s(gw_proc.pid)
    bench = json.loads(r.stdout.strip().splitlines()[-1])
    tokens = bench["throughput_tok_s"] * bench["duration"]
    gw = after - before
    return {"mode": mode, "wall_s": round(wall, 1), "completed": bench.get("completed"),
            "output_tokens": round(tokens), "gateway_cpu_s": round(gw, 2),
            "gateway_cpu_us_per_token": round(gw / tokens * 1e6, 1),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="sarathi")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--qps", type=float, default=4.0)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--port", type=int, default=24517)
    p.add_argument("--modes", nargs="+", default=["plain", "tls", "tls+mtls"])
    args = p.parse_args()
    from sloserve.services.auth import new_token

    os.environ["SLOSERVE_INTERNAL_TOKEN"] = new_token()
    with tempfile.TemporaryDirectory(prefix="tls-cost-") as tmp:
        d = Path(tmp)
        make_pki(d / "pki")
        trace = d / "trace.csv"
        with trace.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["prompt_tokens", "output_tokens"])
            w.writerows([[args.input_len, args.output_len]] * args.num_requests)
        for mode in args.modes:
            print(json.dumps({**run_mode(mode, args, d / "pki", trace),
                              "args": vars(args)}), flush=True)


if __name__ == "__main__":
    main()
