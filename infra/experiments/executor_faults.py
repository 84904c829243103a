"""Issue 11, item 3: an executor SIGSTOPped or SIGKILLed, or a scheduler SIGKILLed, under
50 streams on 2 instances (``sloserve.services.drills.faults.run_fault``, as
``tests/services/test_executor_faults.py`` runs it).

Usage: PYTHONPATH=shared:services python infra/experiments/executor_faults.py
       stop|kill|kill-scheduler HOLD_SECONDS
Appends one JSON line to docs/results/executor_faults.jsonl (``stop 100``, ``kill 1``,
``kill-scheduler 1`` there); Redis at $REDIS_URL.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from sloserve.services.drills.faults import HEALTHY, LOST, run_fault  # noqa: E402
from sloserve.services.executor.backends import pseudo_token  # noqa: E402
from sloserve.services.stack import Stack, StackConfig  # noqa: E402
from sloserve.services.store import free_port  # noqa: E402


def main() -> None:
    fault, hold = sys.argv[1], float(sys.argv[2])
    cfg = StackConfig(policy="sarathi", instances=2, gateway_port=free_port(),
                      redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                      log_dir=Path(f"/tmp/fault_logs_{uuid.uuid4().hex[:6]}"),
                      refit_interval=0.5)
    with Stack(cfg) as stack:
        r = run_fault(stack, fault, hold_s=hold)
    exact = sum(1 for ch in r.results.values()
                if [c.index for c in ch] == list(range(120))
                and [c.token_id for c in ch] == [pseudo_token(ch[0].request_id, i)
                                                 for i in range(120)])
    moved = sum(1 for ch in r.results.values()
                if ch[0].instance_id == LOST and ch[-1].instance_id == HEALTHY)
    out = dict(fault=fault, hold_s=hold, streams=50, completed=len(r.results), exact=exact,
               errors=[str(e) for e in r.errors], moved=moved, detect_s=r.detect_s,
               gateway_s=r.gateway_s, predicted_s=r.predicted_s, deadline_s=r.deadline_s,
               acceptance_line_s=3 * r.predicted_s + 1.0, after_lost=r.after_lost,
               after_back=r.after_back, rejoin_s=r.rejoin_s, health=r.health)
    print(json.dumps(out, indent=1))
    with (ROOT / "docs" / "results" / "executor_faults.jsonl").open("a") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
