"""Issue 11, item 4: a live stack at 3x capacity
(``sloserve.services.drills.overload.run_overload``, as ``tests/services/test_overload.py``
runs it: sim backend slowed 4x, sarathi, one instance).

Usage: PYTHONPATH=shared:services python infra/experiments/overload_3x.py SECONDS [OUT.json]
(docs/results/overload_3x_120s.json: ``120``; Redis at $REDIS_URL.)
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

from sloserve.services.drills.overload import STACK, run_overload  # noqa: E402
from sloserve.services.stack import Stack, StackConfig  # noqa: E402
from sloserve.services.store import free_port  # noqa: E402


def main() -> None:
    duration = float(sys.argv[1])
    cfg = StackConfig(**STACK, gateway_port=free_port(),  # type: ignore[arg-type]
                      redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                      log_dir=Path(f"/tmp/overload_logs_{uuid.uuid4().hex[:6]}"),
                      refit_interval=0.5)
    with Stack(cfg) as stack:
        out = run_overload(stack, duration_s=duration)
    text = json.dumps(out, indent=1)
    print(text)
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(text + "\n")


if __name__ == "__main__":
    main()
