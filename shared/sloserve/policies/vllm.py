"""vLLM's default scheduler (the baseline; Kwon et al., SOSP'23; vLLM V0 ``Scheduler``).

FCFS and prefill-prioritising: if any waiting request can be admitted, the
iteration is prefill-only, with whole prompts up to ``max_num_batched_tokens``
and ``max_num_seqs``; otherwise it is decode-only over every running request.
No mixed batches, no chunking. KV exhaustion preempts by recompute: the
victim is the running request that arrived last, and victims re-enter the
queue's front in arrival order.

A waiting request that can never run is ignored, as V0's ``_schedule_prefills``
does (``SequenceStatus.FINISHED_IGNORED``): its tokens to prefill exceed
``max_num_batched_tokens`` (V0's prompt limit without chunked prefill), or its
blocks exceed the whole KV cache less the 1% watermark (``AllocStatus.NEVER``).
It ends as dropped with vLLM's warning as the reason, and FCFS goes on with the
next request; without this it would block the queue forever. A request
preempted by recompute is checked again on its prompt plus generated tokens,
as in V0.

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
from sloserve.request import Request

KV_WATERMARK = 0.01  # vLLM V0 BlockSpaceManager's default watermark (of all blocks)


def ignore_reason(req: Request, view: InstanceView, max_num_batched_tokens: int) -> str | None:
    """Why vLLM V0 would ignore ``req`` outright (``FINISHED_IGNORED``), or None if it may run."""
    n, limit = req.num_uncomputed, max_num_batched_tokens
    if n > limit:
        return f"Input prompt ({n} tokens) is too long and exceeds limit of {limit}"
    kv = view.kv
    if kv.num_blocks - kv.blocks_for(req.num_tokens) < int(KV_WATERMARK * kv.num_blocks):
        return (f"Input prompt ({n} tokens) is too long and exceeds the capacity of "
                f"block_manager ({kv.num_blocks} blocks of {kv.block_size})")
    return None


@dataclass(frozen=True, slots=True)
class VllmConfig(PolicyConfig):
    """vLLM V0 ``SchedulerConfig``'s two batch limits (its defaults)."""

    max_num_batched_tokens: int = knob(8192, "prefill tokens per iteration (vLLM's cap)", min=1)


class VllmPolicy(Policy):
    name = "vllm"
    config_cls = VllmConfig
    reads_perf_model = False
    config: VllmConfig

    def steady_decodes(self) -> int:
        """Nothing waiting: the decode-only batch, every decode fitting (``add_decodes``)."""
        return self.config.max_num_seqs

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg = self.config
        b = BatchBuilder(view, cfg.max_num_batched_tokens, cfg.max_num_seqs)
        num_running = len(view.running)
        ignored: list[tuple[Request, str]] = []
        for req in view.waiting:  # FCFS: stop at the first request that does not fit
            if num_running + b.num_seqs >= cfg.max_num_seqs:
                break
            reason = ignore_reason(req, view, cfg.max_num_batched_tokens)
            if reason is not None:
                ignored.append((req, reason))
                b.drop(req, reason)
                continue
            if not can_admit(b, req, req.num_uncomputed, KV_WATERMARK):
                break
            b.add(req, req.num_uncomputed)
        if b.num_seqs:
            return b.build()
        b = BatchBuilder(view, max(cfg.max_num_batched_tokens, len(view.running)), cfg.max_num_seqs)
        for req, reason in ignored:  # the ignored ones leave with the decode batch
            b.drop(req, reason)
        add_decodes(b, view.running)
        return b.build()
