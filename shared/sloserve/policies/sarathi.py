"""Sarathi-Serve: chunked prefills and stall-free batching (Agrawal et al., OSDI'24, §4).

Each iteration fills a fixed ``token_budget`` in this order (Algorithm 2):
1. every running decode gets its next token (never stalled by a prefill);
2. ongoing chunked prefills continue, a chunk of at most the tokens left;
3. new requests are admitted FCFS while budget, sequence slots and KV remain.
The budget comes from the TBT SLO: 512 for strict, 2048 for relaxed (§5).

Config: ``SarathiConfig`` (``token_budget``, ``max_num_seqs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sloserve.batch import BatchPlan
from sloserve.policies.base import (
    BatchBuilder,
    BudgetConfig,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes,
    can_admit,
)
from sloserve.request import Request


@dataclass(frozen=True, slots=True)
class SarathiConfig(BudgetConfig):
    """Sarathi-Serve's knobs: the token budget (§4.3, §5) and the batch's sequence cap."""


class SarathiPolicy(Policy):
    name = "sarathi"
    config_cls = SarathiConfig
    reads_perf_model = False
    config: SarathiConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.token_budget = self.config.budget

    def steady_decodes(self) -> int:
        """Decodes only, all fitting (``add_decodes``' fast path), nothing to admit."""
        return min(self.token_budget, self.config.max_num_seqs)

    def schedule(self, view: InstanceView) -> BatchPlan:
        b = BatchBuilder(view, self.token_budget, self.config.max_num_seqs)
        decodes: list[Request] = []
        prefills: list[Request] = []
        for r in view.running:  # r.in_prefill, inlined (it runs per request per iteration)
            g = r.num_generated
            (prefills if g == 0 or r.prompt_len + g - r.num_computed > 1 else decodes).append(r)
        add_decodes(b, decodes)
        for req in prefills:  # ongoing prefills, in admission order
            if not b.removed(req):
                chunk = b.max_chunk(req)
                if chunk:
                    b.add(req, chunk)
        for req in view.waiting:  # new requests, FCFS
            chunk = b.max_chunk(req)
            if chunk == 0 or not can_admit(b, req, chunk):
                break
            b.add(req, chunk)
        return b.build()
