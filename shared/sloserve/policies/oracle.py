"""Output-length oracle: shortest remaining work first on true output lengths.

AccelGen §6.1 compares against an *Oracle* that "knows the remaining time for
job completion, the arrival times and output lengths of all requests, and
schedules the chunking and batching to maximize the goodput", found offline
with the Vidur simulator. That search is not published; this policy is the
online stand-in we can run (docs/accelgen.md): it knows every request's true
output length (``Request.output_len``; the simulator generates exactly that
many tokens) and schedules by it —
1. every running decode gets its token (stall-free, as Sarathi-Serve); on KV
   shortage the running request with the *most* remaining work is preempted,
   so one that is about to finish never is (AccelGen §7's use of the length);
2. ongoing and waiting prefills in ascending true remaining work (SRPT:
   uncomputed prompt tokens + tokens still to generate), chunked to fill the
   token budget; a new request needs KV for its whole prompt (as vLLM).
The budget is AccelGen's pivot forward size ``S_pf`` (measured on the perf
model) unless ``token_budget`` sets it (§3: "S_pf is used as the token budget").

Config: ``OracleConfig`` (``token_budget``, ``max_num_seqs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sloserve.batch import BatchPlan
from sloserve.policies.accelgen_pivot import measure_pivot
from sloserve.policies.base import (
    BatchBuilder,
    BudgetConfig,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes_evicting,
    can_admit,
    knob,
)
from sloserve.policies.waiting_order import WaitingOrder
from sloserve.request import Request


def remaining_work(req: Request) -> int:
    """True tokens still to process: the uncomputed prompt (and recompute) plus the output left."""
    return req.num_uncomputed + req.remaining_output


@dataclass(frozen=True, slots=True)
class OracleConfig(BudgetConfig):
    """The oracle's token budget (default: AccelGen's measured S_pf)."""

    token_budget: int | None = knob(
        None, "oracle: tokens per iteration (default: the measured pivot S_pf, AccelGen §3)",
        min=1)

    def resolved(self, *, tbt_slo: float | None = None,
                 slo_mix: str | None = None) -> OracleConfig:
        """Unchanged: an unset budget is S_pf, measured by the policy."""
        return self


class OraclePolicy(Policy):
    name = "oracle"
    config_cls = OracleConfig
    config: OracleConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.token_budget = self.config.token_budget
        self.order = WaitingOrder(remaining_work)  # the waiting queue in SRPT order

    def on_arrival(self, req: Request, now: float) -> None:
        self.order.join(req)

    def on_requeued(self, reqs: Sequence[Request]) -> None:
        self.order.join_front(reqs)

    def schedule(self, view: InstanceView) -> BatchPlan:
        if self.token_budget is None:
            self.token_budget = measure_pivot(view.perf_model.predict)
        decodes = sorted((r for r in view.running if r.is_decode), key=remaining_work)
        b = BatchBuilder(view, max(self.token_budget, len(decodes)), self.config.max_num_seqs)
        if not b.add_decodes_if_all_fit(decodes):
            add_decodes_evicting(b, decodes, sorted(view.running, key=remaining_work))
        for req in sorted((r for r in view.running if r.in_prefill), key=remaining_work):
            if not b.removed(req) and (chunk := b.max_chunk(req)):
                b.add(req, chunk)
        if view.kv.prefix_caching:  # prefix lookups move waiting keys: sort afresh
            for req in sorted(view.waiting, key=remaining_work):
                chunk = b.max_chunk(req)
                if chunk == 0 or not can_admit(b, req, chunk):
                    break
                b.add(req, chunk)
            return b.build()
        order = self.order
        order.sync(view.waiting)
        while (e := order.pop()) is not None:  # ascending remaining work, no sort
            req = e[2]
            chunk = b.max_chunk(req)
            if chunk == 0 or not can_admit(b, req, chunk):
                order.push_back((e,))
                break
            b.add(req, chunk)
            order.discard(req)
        plan = b.build()
        if plan.preempted:  # back to the waiting queue's front in arrival order (Instance)
            gone = set(plan.preempted)
            order.join_front(sorted((r for r in view.running if r.request_id in gone),
                                    key=lambda r: r.arrival_time))
        return plan
