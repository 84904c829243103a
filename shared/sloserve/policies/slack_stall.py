"""``slack``'s stall that saves a request (docs/lab/beyond.md, "Our policy", "A stall that
saves a request" and "A tight prompt alone"): vLLM's prefill-first iteration — a whole
prompt beside the decodes, or alone while they wait — taken only where the TBT budget's
chunks, or the decodes beside it, would cost the prompt its TTFT, and only as often as
the pooled P99 TBT criterion (Sarathi-Serve §5.1) allows."""

from __future__ import annotations

from collections.abc import Sequence

from sloserve.batch import BatchShape
from sloserve.policies.base import InstanceView
from sloserve.policies.slack_config import SlackConfig
from sloserve.policies.slack_rules import doomed, prompt_work
from sloserve.request import Request

ALONE_MARGIN = 0.2
"""A tight prompt runs alone when beside the decodes its predicted prefill, stretched by
1 + this, ends past its TTFT deadline (the perf model under-predicts mixed batches); a
knob until issue 32, never moved from 0.2 by the grid (docs/lab/beyond.md, "A tight
prompt alone")."""

def tail_of(cfg: SlackConfig, req: Request) -> float | None:
    """The gap ``req``'s TBT is judged against for the pooled P99: ``tail_tbt``, else its own
    TBT SLO."""
    return cfg.tail_tbt or req.slo.tbt


class StallRule:
    """One instance's stalls: the decode gaps it planned and, of those it saw close, the
    ones over the tail TBT (``tail_tbt``, else each request's own TBT SLO), whatever made
    them long: a stall, a long prompt's chunk, a preemption."""

    __slots__ = ("gaps", "over", "_seen")

    def __init__(self) -> None:
        self.gaps = 0  # decode tokens planned on this instance (the gaps they close)
        self.over = 0  # gaps seen closed past the tail TBT
        self._seen: dict[str, int] = {}  # request id -> tokens whose gaps are counted

    def observe(self, cfg: SlackConfig, running: Sequence[Request]) -> None:
        """Count the gaps ``running`` requests closed since the last look."""
        seen = self._seen
        if len(seen) > 2 * len(running) + 64:  # forget the finished ones
            keep = {r.request_id for r in running}
            self._seen = seen = {k: v for k, v in seen.items() if k in keep}
        for r in running:
            tt = r.token_times
            k = seen.get(r.request_id, 1)
            if len(tt) <= k:
                continue
            tail = tail_of(cfg, r)
            if tail is not None:
                self.over += sum(1 for i in range(k, len(tt)) if tt[i] - tt[i - 1] > tail)
            seen[r.request_id] = len(tt)

    def widen(self, view: InstanceView, cfg: SlackConfig, decodes: list[Request],
              budgeted: list[Request], head: Request, start_by: float, limit: float,
              allowance: int) -> tuple[float, int, bool]:
        """``(limit, allowance, alone)`` for this iteration: as given, or ``head``'s whole
        prompt in one iteration — beside ``decodes`` when chunks of ``allowance`` would miss
        its TTFT deadline (``start_by``: its latest start) but the whole prompt makes it;
        *alone*, the decodes waiting one iteration (vLLM's prefill-only iteration), when
        ``head`` is tight — its TTFT SLO under ``alone_tight`` x its prefill alone — and
        beside the decodes it would miss its deadline or end within ``1 + ALONE_MARGIN`` of
        it. Either way only if after it every on-time decode (``budgeted``) still has its
        *mean* TBT (first token to its next, over the gaps) within ``tbt_margin`` of its SLO,
        and the gaps past the tail TBT — those seen so far (``observe``) and those it would
        stretch — stay within ``stall_share`` of all planned gaps. Goodput judges the
        mean (docs/design.md), so a decode that banked time can absorb a stall, as vLLM's
        prefill-first schedule makes it do; the TBT-slack budget guards every other gap."""
        as_is = limit, allowance, False
        work, deadline = prompt_work(head), head.ttft_deadline
        if deadline is None or head.num_generated or work > cfg.max_num_batched_tokens:
            return as_is
        fits = work <= allowance
        dec = tuple(r.num_computed for r in decodes)
        if not fits and not doomed(head, start_by, view, limit, allowance, dec):
            return as_is  # its chunks make it: no stall needed
        predict = view.perf_model.predict
        prompt = ((work, head.num_computed),)
        took = gap = predict(BatchShape(prefills=prompt, decodes=dec))
        now, slo = view.now, head.slo.ttft
        alone = False
        if dec and slo is not None and now + took * (1 + ALONE_MARGIN) > deadline:
            solo = predict(BatchShape(prefills=prompt))
            alone = slo < cfg.alone_tight * solo and now + solo <= deadline
            if alone:  # its next token comes after this and a decode-only iteration
                took, gap = solo, solo + predict(BatchShape(decodes=dec))
        if not alone and (fits or now + took > deadline):
            return as_is  # it makes its TTFT beside the decodes, or not even whole
        for r in budgeted:
            tbt, tt = r.slo.tbt, r.token_times
            if tbt is not None and tt and gap > cfg.tbt_margin * (tt[0] + len(tt) * tbt - now):
                return as_is
        stretched = 0  # the gaps this iteration would take past the tail TBT
        for r in decodes:
            tail = tail_of(cfg, r)
            if tail is not None and r.token_times and now + gap - r.token_times[-1] > tail:
                stretched += 1
        if self.over + stretched > cfg.stall_share * (self.gaps + len(decodes)):
            return as_is
        return max(limit, took), work, alone
