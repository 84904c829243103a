"""``slack``'s stall that saves a request (docs/beyond.md, "Our policy", "A stall that
saves a request" and "A tight prompt alone"): vLLM's prefill-first iteration — a whole
prompt beside the decodes, or alone while they wait — taken only where the TBT budget's
chunks, or the decodes beside it, would cost the prompt its TTFT, and only as often as
the pooled P99 TBT criterion (Sarathi-Serve §5.1) allows."""

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
              allowance: int) -> tuple[float, int, bool]:
        """``(limit, allowance, alone)`` for this iteration: as given, or ``head``'s whole
        prompt in one iteration — beside ``decodes`` when chunks of ``allowance`` would miss
        its TTFT deadline (``start_by``: its latest start) but the whole prompt makes it;
        *alone*, the decodes waiting one iteration (vLLM's prefill-only iteration), when
        ``head`` is tight — its TTFT SLO under ``alone_tight`` x its prefill alone — and
        beside the decodes it would miss its deadline or end within ``1 + alone_margin`` of
        it. Either way only if after it every on-time decode (``budgeted``) still has its
        *mean* TBT (first token to its next, over the gaps) within ``tbt_margin`` of its SLO,
        and the gaps it stretches past their own TBT SLO keep the stretched gaps within
        ``stall_share`` of all planned gaps (they count once granted). Goodput judges the
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
        if dec and slo is not None and now + took * (1 + cfg.alone_margin) > deadline:
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
        stretched = sum(1 for r in decodes if r.slo.tbt is not None and r.token_times
                        and now + gap - r.token_times[-1] > r.slo.tbt)
        if self.stretched + stretched > cfg.stall_share * (self.gaps + len(decodes)):
            return as_is
        self.stretched += stretched
        return max(limit, took), work, alone
