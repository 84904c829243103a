"""``slack``'s stall that saves a request (docs/beyond.md, "Our policy" and "A stall that
saves a request"): vLLM's prefill-first iteration — a whole prompt beside the decodes —
taken only where chunks of the TBT budget would cost the prompt its TTFT, and only as
often as the pooled P99 TBT criterion (Sarathi-Serve §5.1) allows."""

from __future__ import annotations

from sloserve.batch import BatchShape
from sloserve.policies.base import InstanceView
from sloserve.policies.slack_config import SlackConfig
from sloserve.policies.slack_rules import doomed, prompt_work
from sloserve.request import Request


class StallRule:
    """One instance's stalls: the decode gaps it planned and, of them, those a stall
    stretched past their own TBT SLO."""

    __slots__ = ("gaps", "stretched")

    def __init__(self) -> None:
        self.gaps = 0  # decode tokens planned on this instance (the gaps they close)
        self.stretched = 0  # of them, planned in a stall past their own TBT SLO

    def widen(self, view: InstanceView, cfg: SlackConfig, decodes: list[Request],
              budgeted: list[Request], head: Request, start_by: float, limit: float,
              allowance: int) -> tuple[float, int]:
        """``(limit, allowance)`` for this iteration: as given, or widened to ``head``'s
        whole prompt when chunks of ``allowance`` would miss its TTFT deadline (``start_by``:
        its latest start), the whole prompt beside ``decodes`` is predicted to make it,
        after that iteration every on-time decode (``budgeted``) still has its *mean* TBT
        (first token to its next, over the gaps) within ``tbt_margin`` of its SLO, and the
        gaps it stretches past their own TBT SLO keep the stretched gaps within
        ``stall_share`` of all planned gaps (they count once granted). Goodput judges the
        mean (docs/design.md), so a decode that banked time can absorb a stall, as vLLM's
        prefill-first schedule makes it do; the TBT-slack budget guards every other gap."""
        work, deadline = prompt_work(head), head.ttft_deadline
        if (deadline is None or head.num_generated or work <= allowance
                or work > cfg.max_num_batched_tokens):
            return limit, allowance
        dec = tuple(r.num_computed for r in decodes)
        if not doomed(head, start_by, view, limit, allowance, dec):
            return limit, allowance  # its chunks make it: no stall needed
        took = view.perf_model.predict(BatchShape(prefills=((work, head.num_computed),),
                                                  decodes=dec))
        now = view.now
        if now + took > deadline:
            return limit, allowance  # hopeless even whole
        for r in budgeted:
            tbt, tt = r.slo.tbt, r.token_times
            if tbt is not None and tt and took > cfg.tbt_margin * (tt[0] + len(tt) * tbt - now):
                return limit, allowance
        stretched = sum(1 for r in decodes if r.slo.tbt is not None and r.token_times
                        and now + took - r.token_times[-1] > r.slo.tbt)
        if self.stretched + stretched > cfg.stall_share * (self.gaps + len(decodes)):
            return limit, allowance
        self.stretched += stretched
        return max(limit, took), work
