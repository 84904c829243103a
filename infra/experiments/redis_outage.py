"""Issue 11 acceptance: Redis killed for 3 s and for 30 s during a 50-stream run under
`sloserve up` (sim backend, its supervisor): 0 accepted requests lost, new requests
served within 5 s of Redis returning, `up` still running.

Redis is a ``redis-server`` of this script's own (no persistence: it comes back empty),
never the shared one. Once every stream has its first token Redis is SIGKILLed (or, with
``--mode stop``, SIGSTOPped: connections hang instead of failing) for ``--outage-s``,
then started again on the same port (SIGCONT). Measured: every stream's tokens against
the undisturbed run's (the sim backend's pseudo-tokens), a request made during the
outage and one made the moment Redis answers again (seconds to its last token), when
the scheduler's queue is back in Redis, `up`'s supervisor lines, each service's
``redis_unavailable``/``redis_back`` events, tracebacks, and `up`'s exit on SIGTERM.

Usage: PYTHONPATH=shared:services python infra/experiments/redis_outage.py
       --outage-s 30 [--tokens 4000] [--mode kill|stop]
Appends one JSON line to docs/results/redis_outage.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

import redis  # noqa: E402

from sloserve.client import Client  # noqa: E402
from sloserve.services.drills.redis_server import ThrowawayRedis  # noqa: E402
from sloserve.services.drills.streams import start_streams  # noqa: E402
from sloserve.services.executor.backends import pseudo_token  # noqa: E402
from sloserve.services.store import Keys  # noqa: E402

STREAMS = 50


def port_in(lo: int, hi: int) -> int:
    """A free loopback port in [lo, hi] (this helper's range)."""
    for _ in range(200):
        port = random.randint(lo, hi)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi}")


def short(client: Client, rid: str) -> float:
    """Seconds until a 4-token request is complete."""
    t0 = time.monotonic()
    chunks = list(client.generate(prompt_token_ids=[70] * 20, max_tokens=4, request_id=rid,
                                  ttft_slo=30.0, tbt_slo=30.0, timeout=60))
    assert [c.index for c in chunks] == [0, 1, 2, 3], chunks
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--outage-s", type=float, required=True)
    ap.add_argument("--tokens", type=int, default=0,
                    help="per stream (default: enough to outlive the outage)")
    ap.add_argument("--mode", choices=("kill", "stop"), default="kill")
    ap.add_argument("--ports", default="20000-20999", help="range for Redis and the gateway")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "redis_outage.jsonl"))
    a = ap.parse_args()
    tokens = a.tokens or max(400, int(a.outage_s * 100 + 1000))
    lo, hi = (int(x) for x in a.ports.split("-"))
    server = ThrowawayRedis()
    server.port = port_in(lo, hi)
    server.start()
    gw_port = port_in(lo, hi)
    prefix = f"h11-outage:{uuid.uuid4().hex[:8]}"
    logdir = Path(tempfile.mkdtemp(prefix="redis-outage-"))
    up = subprocess.Popen(
        [sys.executable, "-m", "sloserve.services.cli", "up", "--backend", "sim", "--policy",
         "sarathi", "--port", str(gw_port), "--http-port", "0", "--redis-url", server.url,
         "--prefix", prefix, "--log-dir", str(logdir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    ready = threading.Event()

    def drain() -> None:
        assert up.stdout is not None
        for line in up.stdout:
            lines.append((time.monotonic(), line.rstrip()))
            if "ready" in line:
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    res: dict[str, Any] = {"mode": a.mode, "outage_s": a.outage_s, "streams": STREAMS,
                           "tokens": tokens, "loadavg_before": os.getloadavg()}
    try:
        if not ready.wait(120):
            raise RuntimeError(f"up not ready: {lines[-20:]}")
        client = Client(f"127.0.0.1:{gw_port}")
        t_start = time.monotonic()
        streams = start_streams(client, STREAMS, tokens, "outage", timeout=600,
                                first_token_s=120)
        results, threads = streams.results, streams.threads
        assert server.proc is not None
        if a.mode == "kill":
            server.kill()
        else:
            os.kill(server.proc.pid, signal.SIGSTOP)
        t_down = time.monotonic()
        res["streams_started_s"] = round(t_down - t_start, 2)
        res["during_s"] = round(short(client, "while-down"), 3)
        time.sleep(max(0.0, a.outage_s - (time.monotonic() - t_down)))
        if a.mode == "kill":
            server.start()  # answers PING when this returns
        else:
            os.kill(server.proc.pid, signal.SIGCONT)
        t_up = time.monotonic()
        res["down_s"] = round(t_up - t_down, 2)
        res["after_s"] = round(short(client, "after-return"), 3)  # from Redis answering
        r = redis.Redis(port=server.port)
        queue = Keys(prefix).queue("lp0")
        while time.monotonic() - t_up < 15 and not r.zcard(queue):
            time.sleep(0.05)
        res["queue_in_redis_after_s"] = (round(time.monotonic() - t_up, 2) if r.zcard(queue)
                                         else None)
        res["streams_live_at_return"] = sum(1 for t in threads if t.is_alive())
        r.close()
        for t in threads:
            t.join(timeout=900)
        res["streams_done_s_after_return"] = round(time.monotonic() - t_up, 1)
        exact = [k for k, ch in results.items()
                 if [c.index for c in ch] == list(range(tokens))
                 and [c.token_id for c in ch] == [pseudo_token(f"outage-{k}", i)
                                                  for i in range(tokens)]]
        res.update(completed=len(results), exact=len(exact), lost=STREAMS - len(exact),
                   errors=[repr(e) for e in streams.errors[:5]])
        client.close()
        res["up_running"] = up.poll() is None
        res["supervisor_lines"] = [ln for _, ln in lines if "supervisor" in ln][:20]
        events: dict[str, dict[str, Any]] = {}
        for log in sorted(logdir.glob("*.log")):
            text = log.read_text(errors="replace")
            evs = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
            down = [e.get("task") for e in evs if e.get("event") == "redis_unavailable"]
            back = [(e.get("task"), e.get("down_s")) for e in evs
                    if e.get("event") == "redis_back"]
            events[log.stem] = {"redis_unavailable": down, "redis_back": back,
                                "traceback": "Traceback" in text}
        res["service_events"] = events
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            res["up_exit"] = up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            res["up_exit"] = "killed after 60 s"
        if server.proc is not None and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.kill()
    res["loadavg_after"] = os.getloadavg()
    res["log_dir"] = str(logdir)
    print(json.dumps(res, indent=1))
    with open(a.out, "a") as f:
        f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
