"""What a policy returns (``BatchPlan``) and what a perf model sees (``BatchShape``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple


class ScheduledItem(NamedTuple):
    """``num_tokens`` new tokens of one request over ``context_len`` cached ones.

    A NamedTuple: immutable and cheap to build, as one is made per request per iteration.
    """

    request_id: str
    num_tokens: int
    context_len: int
    is_prefill: bool


@dataclass(frozen=True, slots=True)
class BatchShape:
    """A batch as the performance models see it.

    ``prefills``: (chunk_len, context_len) per prefill chunk, context = tokens
    already in KV before the chunk. ``decodes``: context length per decode
    (tokens in KV, excluding the one being decoded).
    """

    prefills: tuple[tuple[int, int], ...] = ()
    decodes: tuple[int, ...] = ()

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c for c, _ in self.prefills)

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decodes)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.prefills) + len(self.decodes)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes


@dataclass(frozen=True, slots=True)
class BatchSample:
    """One executed batch with its measured duration (perf-model training data)."""

    shape: BatchShape
    duration: float  # seconds


@dataclass(slots=True)
class BatchPlan:
    """One iteration's decision for one instance (docs/design.md, policy interface)."""

    items: list[ScheduledItem] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    offloaded: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    # why a request in ``dropped`` was dropped, when the policy says (else the controller's default)
    drop_reasons: dict[str, str] = field(default_factory=dict)
    # an empty plan's timer: ask the policy again at this time even if nothing arrives
    # (only where the driver offers timers, ``InstanceView.timers``; e.g. slack's pacing)
    wake_at: float | None = None

    @property
    def num_tokens(self) -> int:
        return sum(i.num_tokens for i in self.items)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(i.num_tokens for i in self.items if i.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(i.num_tokens for i in self.items if not i.is_prefill)

    @property
    def is_empty(self) -> bool:
        return not self.items

    def shape(self) -> BatchShape:
        items = self.items
        if not any(map(_is_prefill, items)):  # the common all-decode iteration: C-level
            return BatchShape((), tuple(map(_context_len, items)))
        decodes = tuple([ctx for _, _, ctx, pre in items if not pre])
        return BatchShape(tuple([(n, ctx) for _, n, ctx, pre in items if pre]), decodes)


_is_prefill = itemgetter(3)  # ScheduledItem.is_prefill
_context_len = itemgetter(2)  # ScheduledItem.context_len
