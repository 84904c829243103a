"""Decision records: the controller's actions and the batch plans, as plain dicts.

The simulator and the live services write the same records (the live ones as
JSON lines with ``--decision-log``), so a test can check that both drivers
made the same decisions on the same scenario (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

from sloserve.batch import BatchPlan
from sloserve.controller import Action, Dispatch


def action_record(action: Action) -> dict[str, Any]:
    if isinstance(action, Dispatch):
        return {"kind": "dispatch", "request": action.request_id,
                "instance": action.instance_id, "cause": action.cause}
    return {"kind": "drop", "request": action.request_id, "reason": action.reason}


def plan_record(instance_id: str, plan: BatchPlan) -> dict[str, Any]:
    return {
        "kind": "plan", "instance": instance_id,
        "items": [[i.request_id, i.num_tokens, i.context_len] for i in plan.items],
        "preempted": list(plan.preempted), "offloaded": list(plan.offloaded),
        "dropped": list(plan.dropped),
    }
