"""Issue 11 acceptance: the poison inputs on a live stack (sim backend, `sarathi`,
``time_scale`` 2) while a normal 300-token stream runs: each poison's time to its status
through a gRPC client (``rounds`` times), the oversized ones at the frame level
(``services/sloserve/services/drills/h2.py``: the gateway's own reaction), the normal
stream's gaps as
the gateway sent them, and the gateway's RSS before, right after and 2 s after
(``sloserve.services.drills.poison.run_poison``, as ``tests/services/test_input_limits.py``
runs it).

Usage: PYTHONPATH=shared:services python infra/experiments/poison_inputs.py [ROUNDS]
       > docs/results/poison_inputs.json   (Redis at $REDIS_URL)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra" / "experiments"))

from redis_outage import port_in  # noqa: E402

from sloserve.services.drills.poison import run_poison  # noqa: E402
from sloserve.services.stack import Stack, StackConfig  # noqa: E402


def _spread(xs: list[float]) -> list[float]:
    xs = sorted(xs)
    return [round(xs[0] * 1e3, 1), round(xs[len(xs) // 2] * 1e3, 1), round(xs[-1] * 1e3, 1)]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    load_before = os.getloadavg()
    cfg = StackConfig(policy="sarathi", time_scale=2.0, gateway_port=port_in(20000, 20999),
                      redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                      prefix=f"h11-poison:{uuid.uuid4().hex[:8]}",
                      log_dir=Path(tempfile.mkdtemp(prefix="poison-")))
    with Stack(cfg) as stack:
        run = run_poison(stack, rounds=rounds)
        exited = stack.exited()
    out = {
        "rounds": rounds, "spread": "min, median, max (ms)",
        "client_ms": {k: _spread(v) for k, v in run.latencies.items()},
        "frame_level_ms": {k: _spread([r.seconds for r in v]) for k, v in run.refusals.items()},
        "frame_level_answer": {k: sorted({r.frames[-1] for r in v})
                               for k, v in run.refusals.items()},
        "normal_gap_ms": {"median": round(run.median_gap * 1e3, 1),
                          "max_during": round(max(run.during) * 1e3, 1),
                          "max_after": round(max(run.after, default=0.0) * 1e3, 1),
                          "n_during": len(run.during)},
        "gateway_rss_mb": {"before": round(run.rss_before / 1e6, 1),
                           "after": round(run.rss_after / 1e6, 1),
                           "settled_2s": round(run.rss_settled / 1e6, 1)},
        "exited": exited, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
