"""Ascendra §8.6's overload rule for any policy: drop requests left waiting past their TTFT.

"We evaluated all frameworks ... Any request that remains in the waiting
queue past the TTFT SLO is dropped." Ascendra has the rule built in
(``drop_late``); ``with_drop_late`` gives a baseline the same rule so the
§8.6 comparison treats every framework alike. The policy underneath
schedules as if the late requests were not there; they leave as drops
(``plan.dropped``), exactly as Ascendra's do. Only requests that have not
started prefill and have produced no token are dropped.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from sloserve.batch import BatchPlan
from sloserve.policies.ascendra_lp import late_requests
from sloserve.policies.base import InstanceView, Policy


@cache
def with_drop_late(base: type[Policy]) -> type[Policy]:
    """``base`` plus §8.6's drop of waiting requests past their TTFT deadline."""

    class DropLate(base):  # type: ignore[valid-type, misc]
        name = f"{base.name}+drop-late"

        def schedule(self, view: InstanceView) -> BatchPlan:
            late = late_requests(view)
            if not late:
                return super().schedule(view)  # type: ignore[no-any-return]
            ids = {r.request_id for r in late}
            rest = [r for r in view.waiting if r.request_id not in ids]
            plan: BatchPlan = super().schedule(replace(view, waiting=rest))
            plan.dropped.extend(r.request_id for r in late)
            return plan

    DropLate.__name__ = DropLate.__qualname__ = f"DropLate{base.__name__}"
    return DropLate
