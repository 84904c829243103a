"""Issue 34, item 6: a whole-stack restart mid-run (30 streams of 150 tokens, sim backend,
``sarathi``, 2 instances, ``time_scale`` 2), the same Redis and prefix; every client
re-attaches by request id (``sloserve.services.drills.restart.drill``, as
``tests/services/test_stack_restart.py`` runs it). Counts each request resumed (the rest
of its stream, exact) or ended with a status, and whether the gateway logged it.

Usage: PYTHONPATH=shared:services python infra/experiments/stack_restart.py term|kill
       [--attach-after-s S --grace-s G]
Appends one JSON line to docs/results/stack_restart.jsonl; Redis at $REDIS_URL.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from sloserve.services.drills.restart import drill  # noqa: E402
from sloserve.services.stack import Stack, StackConfig  # noqa: E402
from sloserve.services.store import free_port  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("signal", choices=("term", "kill"))
    p.add_argument("--streams", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=150)
    p.add_argument("--attach-after-s", type=float, default=0.0)
    p.add_argument(
        "--grace-s",
        type=float,
        default=None,
        help="the restarted gateway's --reattach-grace (default: its own)",
    )
    args = p.parse_args()
    sig = signal.SIGTERM if args.signal == "term" else signal.SIGKILL
    cfg = StackConfig(
        policy="sarathi",
        instances=2,
        gateway_port=free_port(),
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        prefix=f"restart-exp:{uuid.uuid4().hex[:8]}",
        time_scale=2.0,
        log_dir=Path(f"/tmp/stack_restart_{uuid.uuid4().hex[:6]}"),
        refit_interval=0.5,
    )
    grace = args.grace_s

    def with_grace(stack: Stack) -> None:
        if grace is None:
            return
        plan = stack.plan

        def planned() -> None:
            plan()
            stack.services["gateway"].argv += ["--reattach-grace", str(grace)]

        stack.plan = planned  # type: ignore[method-assign]

    load0 = os.getloadavg()[0]
    t0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    stack = Stack(cfg).start()
    try:
        outcomes, down = drill(
            stack,
            args.streams,
            args.max_tokens,
            sig,
            attach_after_s=args.attach_after_s,
            on_restart=with_grace,
        )
    finally:
        stack.stop()
        stack._forget_keys()  # the fixed prefix: nobody resumes it again
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    kinds = Counter("resumed" if o.resumed else o.status.split(":")[0] for o in outcomes)
    out = dict(
        signal=args.signal,
        streams=args.streams,
        max_tokens=args.max_tokens,
        attach_after_s=args.attach_after_s,
        grace_s=grace,
        down_s=round(down, 2),
        resumed=kinds.pop("resumed", 0),
        ended=dict(kinds),
        logged=sum(o.logged for o in outcomes),
        before=sorted(o.before for o in outcomes),
        silent=[o.request_id for o in outcomes if not o.logged or (not o.resumed and not o.status)],
        load_1m=[round(load0, 2), round(os.getloadavg()[0], 2)],
        wall_s=round(time.monotonic() - t0, 1),
        services_cpu_s=round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
        statuses=sorted({o.status for o in outcomes if o.status})[:3],
        log_dir=str(cfg.log_dir),
    )
    print(json.dumps(out, indent=1))
    with (ROOT / "docs" / "results" / "stack_restart.jsonl").open("a") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
