"""CPU share of ``sloserve up``'s own process (the supervisor) while the stack idles
(issue 35: at most 0.5 % of a core).

Starts ``sloserve up`` (sim backend, default flags, free ports, ``$REDIS_URL`` or with
``--embedded`` the embedded store), waits for
"gateway ready" plus ``--settle`` seconds, then reads utime + stime of the ``up``
process (all its threads; not its children) from ``/proc`` over ``--seconds`` of idle,
and prints one JSON line. Kills what it started.

    PYTHONPATH=shared:services python infra/bench/up_idle.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all threads), seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import random
    import socket

    while True:
        port = random.randint(20000, 29999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle window measured")
    ap.add_argument("--settle", type=float, default=10.0, help="wait after ready, s")
    ap.add_argument("--embedded", action="store_true",
                    help="no $REDIS_URL: up serves an embedded store in its own process "
                         "(its cost then counts too)")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" or not args.embedded}
    log_dir = tempfile.mkdtemp(prefix="up-idle-")
    up = subprocess.Popen(
        [sys.executable, "-m", "sloserve.services.cli", "up", "--port", str(free_port()),
         "--http-port", str(free_port()), "--log-dir", log_dir],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if "gateway ready" in line:
                break
        else:
            raise SystemExit("up exited before ready")
        time.sleep(args.settle)
        c0, t0 = cpu_s(up.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = cpu_s(up.pid), time.monotonic()
        load = os.getloadavg()
        print(json.dumps({"embedded_redis": args.embedded, "idle_s": round(t1 - t0, 1),
                          "cpu_s": round(c1 - c0, 3),
                          "core_share_pct": round(100 * (c1 - c0) / (t1 - t0), 3),
                          "loadavg": [round(x, 2) for x in load]}))
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
