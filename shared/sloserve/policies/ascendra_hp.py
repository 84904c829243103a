"""Ascendra's high-priority (HP) instance (§6): latency tier for offloaded and ticketed requests.

* Prefill over decode, strict FCFS (§6, Figure 7; §8.3 "HP follows strict
  FCFS"), on vLLM's pattern: if any waiting prefill can be admitted the
  iteration is prefill-only, whole prompts in arrival-at-HP order; otherwise
  it is decode-only over every running request (decode stalls are the
  accepted cost, §4). A prefill iteration holds at most
  ``hp_worst_batch_tokens`` tokens, the very batch the LP's offload rule
  assumes as HP's worst case (§5.3); a longer prompt runs alone.
* Elastic batch (§6.2, §8.5): no fixed sequence cap; prefills are admitted
  "as long as GPU memory permits", keeping in reserve the blocks that running
  and admitted requests are expected to still need for their decodes, but
  never more than ``hp_free_kv_fraction`` (10%) of the KV cache: §8.5 says the
  batch grows whenever free memory exceeds 10% of the total, and §6.2 accepts
  the preemption risk this brings. So a prefill waits only while admitting it
  would leave less than ``min(expected decode growth, 10%)`` free, and an
  offload waits at most the batch the HP is running (§6.1's promise) unless
  KV really is nearly full. Expected output length is the running mean of
  the output lengths of requests that finished on this instance (the
  "decoding length history"), capped by each request's ``max_tokens``;
  before any has finished it is ``hp_decode_len_prior`` (default 0). If
  nothing runs, the head is admitted whenever its prompt fits, so the
  instance never idles on a reservation.
  ``hp_elastic = False`` turns this off for the §8.5 ablation: then
  ``max_num_seqs`` caps running requests and nothing is reserved.
* Ticket entry (§6.1 with §8.5): ``offers_ticket`` tells the controller
  whether this HP invites one opportunistic new request: only while the KV
  left after every running request's expected decode exceeds
  ``hp_free_kv_fraction``, so ticketed requests (which decode here for their
  whole life) never take the memory offloads need. Always with
  ``hp_elastic = False`` (the ablation keeps the plain queue-empty rule).
* ``drop_late`` (§6.3) drops waiting requests already past their TTFT SLO.
* An HP instance never offloads.

Config (``AscendraConfig``) used: ``hp_worst_batch_tokens``, ``drop_late``,
``max_num_seqs`` (only with ``hp_elastic = False``), ``hp_elastic``, ``hp_decode_len_prior``,
``hp_free_kv_fraction``.
"""

from __future__ import annotations

import math

from sloserve.batch import BatchPlan
from sloserve.kv import BlockManager
from sloserve.policies.ascendra import AscendraConfig
from sloserve.policies.ascendra_lp import late_requests
from sloserve.policies.base import (
    BatchBuilder,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes,
    can_admit,
)
from sloserve.request import Request, RequestStatus


class AscendraHPPolicy(Policy):
    name = "ascendra-hp"
    config_cls = AscendraConfig
    config: AscendraConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.elastic = self.config.hp_elastic
        self.decode_len_prior = self.config.hp_decode_len_prior
        self._num_finished = 0
        self._sum_output = 0
        self._in_batch: list[Request] = []

    @property
    def mean_decode_len(self) -> float:
        """Mean output length of the requests finished here (the prior before any)."""
        if self._num_finished == 0:
            return self.decode_len_prior
        return self._sum_output / self._num_finished

    def decode_reserve(self, kv: BlockManager, req: Request) -> int:
        """KV blocks ``req`` is expected to still need for its remaining decodes (§6.2)."""
        expected = min(max(math.ceil(self.mean_decode_len), req.num_generated), req.output_len)
        return max(0, kv.blocks_for(req.prompt_len + expected) - kv.blocks_for(req.num_tokens))

    def offers_ticket(self, view: InstanceView) -> bool:
        """§6.1 + §8.5: invite an opportunistic (ticketed) request only while the KV left
        after every running request's expected decode exceeds ``hp_free_kv_fraction``."""
        if not self.elastic:
            return True
        kv = view.kv
        reserved = sum(self.decode_reserve(kv, r) for r in view.running)
        return kv.num_free_blocks - reserved > self.config.hp_free_kv_fraction * kv.num_blocks

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        late = late_requests(view) if cfg.drop_late else []
        prefills = [r for r in view.running if r.in_prefill]
        if late:
            late_ids = {r.request_id for r in late}
            prefills += [r for r in view.waiting if r.request_id not in late_ids]
        else:
            prefills += view.waiting
        cap = max(cfg.hp_worst_batch_tokens, prefills[0].num_uncomputed if prefills else 0)
        max_seqs = len(view.running) + len(view.waiting) + 1 if self.elastic else cfg.max_num_seqs

        def builder(token_budget: int) -> BatchBuilder:
            b = BatchBuilder(view, token_budget, max_seqs)
            for req in late:
                b.drop(req)
            return b

        b = builder(cap)
        self._admit_prefills(b, prefills)
        if b.num_seqs == 0:  # no prefill could run: decode-only iteration
            b = builder(max(len(view.running), 1))
            add_decodes(b, [r for r in view.running if r.is_decode])
        self._in_batch = [r for r in (*view.running, *view.waiting) if b.contains(r)]
        return b.build()

    def _admit_prefills(self, b: BatchBuilder, prefills: list[Request]) -> None:
        """Whole prompts, FCFS, within the builder's token cap; the first misfit ends it."""
        kv, running = b.view.kv, b.view.running
        reserved = sum(self.decode_reserve(kv, r) for r in running) if self.elastic else 0
        reserve_cap = int(self.config.hp_free_kv_fraction * kv.num_blocks)
        num_running = len(running)
        for req in prefills:
            n = req.num_uncomputed
            if req.prefill_started:  # already admitted (holds KV): just continue it
                if not b.fits(req, n):
                    break
                b.add(req, n)
                continue
            if not self.elastic and num_running + b.num_seqs >= self.config.max_num_seqs:
                break
            if not can_admit(b, req, n):
                break
            grow = self.decode_reserve(kv, req) if self.elastic else 0
            busy = num_running > 0 or b.num_seqs > 0
            keep_free = min(grow + reserved, reserve_cap)
            if busy and b.blocks_needed(req, n) + keep_free > b.free_blocks:
                break
            b.add(req, n)
            reserved += grow

    def on_batch_end(self, view: InstanceView, plan: BatchPlan) -> None:
        for req in self._in_batch:
            if req.status is RequestStatus.FINISHED:
                self._num_finished += 1
                self._sum_output += req.num_generated
        self._in_batch = []
