"""Issue 36, item 7: per-tenant fairness, one command. Two API keys on one instance
(``run_fairness`` of ``tests/services/test_fairness.py``: sim backend slowed 4x,
sarathi): key B at 30% of capacity, key A flooding at 5x that, with the per-key limits
of the test (``--no-limits``: today's per-instance admission only).

Usage: PYTHONPATH=shared:services python infra/experiments/fairness_two_keys.py SECONDS
       [OUT.json] [--no-limits] [--seed N]
Prints one JSON summary (with the machine's load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import uuid
from pathlib import Path

from sloserve.services.drills.fairness import LIMITS, keys_file, run_fairness  # noqa: E402
from sloserve.services.drills.overload import STACK  # noqa: E402
from sloserve.services.stack import Stack, StackConfig  # noqa: E402
from sloserve.services.store import free_port  # noqa: E402
from sloserve.tenancy import KeyLimits  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("seconds", type=float)
    p.add_argument("out", nargs="?", default=None)
    p.add_argument("--no-limits", action="store_true", help="no per-key limits (before)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    limits = KeyLimits() if args.no_limits else LIMITS
    with tempfile.TemporaryDirectory() as tmp:
        cfg = StackConfig(**STACK, gateway_port=free_port(),  # type: ignore[arg-type]
                          redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                          prefix=f"fairness:{uuid.uuid4().hex[:8]}",
                          log_dir=Path(tmp) / "logs", refit_interval=0.5,
                          api_key_file=keys_file(Path(tmp)), key_limits=limits)
        load_before = os.getloadavg()
        with Stack(cfg) as stack:
            out = run_fairness(stack, duration_s=args.seconds, seed=args.seed)
    out.update(limits={"max_inflight_per_key": limits.max_inflight,
                       "key_token_rate": limits.token_rate,
                       "key_token_burst": limits.token_burst},
               loadavg_before=load_before, loadavg_after=os.getloadavg())
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
