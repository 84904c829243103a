"""Orca: iteration-level scheduling with whole prefills (Yu et al., OSDI'22), as AccelGen runs it.

AccelGen's baseline (§3, §6.1: batch size 8, maximum sequence length 8K, KV
reserved as ``|B| · S_lmax``) and Sarathi-Serve's. Each iteration:
1. every running decode gets its next token (iteration-level: a finished
   request leaves and a new one joins at the next iteration);
2. waiting requests join FCFS with their *whole* prompt in the same batch
   (selective batching mixes prefills and decodes; no chunking, no token
   budget) while the batch has a slot and a ``max_seq_len`` reservation fits
   the KV cache for every request in it.
The reservation is an admission rule only; blocks are still allocated as
tokens arrive, so a request longer than ``max_seq_len`` can still run out of
KV, and is then preempted by recompute as vLLM does.

Config: ``OrcaConfig`` (``max_num_seqs``, ``max_seq_len``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

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
class OrcaConfig(PolicyConfig):
    """Orca's batch limits as AccelGen §3 set them."""

    max_num_seqs: int = knob(8, "most sequences in one batch (Orca in AccelGen §3: 8)", min=1)
    max_seq_len: int = knob(
        8192, "Orca: KV reserved per request, tokens (AccelGen §3: 8K)", min=1)


class OrcaPolicy(Policy):
    name = "orca"
    config_cls = OrcaConfig
    reads_perf_model = False
    config: OrcaConfig

    def steady_decodes(self) -> int:
        """Nothing waiting: every decode, all fitting (``add_decodes``), nothing admitted."""
        return self.config.max_num_seqs

    def schedule(self, view: InstanceView) -> BatchPlan:
        cfg, kv = self.config, view.kv
        reserve = kv.blocks_for(cfg.max_seq_len)
        heads = islice(view.waiting, cfg.max_num_seqs)
        budget = len(view.running) + sum(r.num_uncomputed for r in heads)
        b = BatchBuilder(view, max(budget, 1), cfg.max_num_seqs)
        add_decodes(b, [r for r in view.running if r.is_decode])
        seqs = sum(1 for r in view.running if not b.removed(r))
        for req in view.waiting:  # FCFS, whole prompts
            if seqs >= cfg.max_num_seqs or (seqs + 1) * reserve > kv.num_blocks:
                break
            if not can_admit(b, req, req.num_uncomputed, watermark=0.0):
                break
            b.add(req, req.num_uncomputed)
            seqs += 1
        return b.build()
