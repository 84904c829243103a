"""Issue 11, item 4 and issue 36, item 3: a live stack at 3x capacity
(``sloserve.services.drills.overload.run_overload``, as ``tests/services/test_overload.py``
runs it: sim backend slowed 4x, sarathi, one instance).

Usage: PYTHONPATH=shared:services python infra/experiments/overload_3x.py SECONDS [OUT.json]
       [--busy] [--seed N]
(docs/results/overload_3x_120s.json: ``120``; ``--busy``: a second process keeps one
core busy for the run, issue 36's busy host; Redis at $REDIS_URL.) Prints one JSON
summary (with the machine's load average before and after).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import uuid
from pathlib import Path

from sloserve.services.drills.overload import STACK, busy_core, run_overload  # noqa: E402
from sloserve.services.stack import Stack, StackConfig  # noqa: E402
from sloserve.services.store import free_port  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("seconds", type=float)
    p.add_argument("out", nargs="?", default=None)
    p.add_argument("--busy", action="store_true", help="a second process keeps one core busy")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = StackConfig(**STACK, gateway_port=free_port(),  # type: ignore[arg-type]
                      redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                      log_dir=Path(f"/tmp/overload_logs_{uuid.uuid4().hex[:6]}"),
                      refit_interval=0.5)
    load_before = os.getloadavg()
    with Stack(cfg) as stack, (busy_core() if args.busy else contextlib.nullcontext()):
        out = run_overload(stack, duration_s=args.seconds, seed=args.seed)
    out.update(busy=args.busy, seed=args.seed, loadavg_before=load_before,
               loadavg_after=os.getloadavg())
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
