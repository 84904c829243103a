"""vLLM's default scheduler (the baseline; Kwon et al., SOSP'23; vLLM V0 ``Scheduler``).

FCFS and prefill-prioritising: if any waiting request can be admitted, the
iteration is prefill-only, with whole prompts up to ``max_num_batched_tokens``
and ``max_num_seqs``; otherwise it is decode-only over every running request.
No mixed batches, no chunking. KV exhaustion preempts by recompute.

Config: ``VllmConfig`` (``max_num_seqs``, ``max_num_batched_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sloserve.batch import BatchPlan
from sloserve.policies.base import (
    BatchBuilder,
    InstanceView,
    Policy,
    PolicyConfig,
    add_decodes,
    can_admit,
    knob,
)


@dataclass(frozen=True, slots=True)
class VllmConfig(PolicyConfig):
    """vLLM V0 ``SchedulerConfig``'s two batch limits (its defaults)."""

    max_num_batched_tokens: int = knob(8192, "prefill tokens per iteration (vLLM's cap)", min=1)


class VllmPolicy(Policy):
    name = "vllm"
    config_cls = VllmConfig
    config: VllmConfig

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        b = BatchBuilder(view, cfg.max_num_batched_tokens, cfg.max_num_seqs)
        num_running = len(view.running)
        for req in view.waiting:  # FCFS: stop at the first request that does not fit
            if num_running + b.num_seqs >= cfg.max_num_seqs:
                break
            if not can_admit(b, req, req.num_uncomputed):
                break
            b.add(req, req.num_uncomputed)
        if b.num_seqs:
            return b.build()
        b = BatchBuilder(view, max(cfg.max_num_batched_tokens, len(view.running)), cfg.max_num_seqs)
        add_decodes(b, view.running)
        return b.build()
