"""The policy seam (DESIGN.md): a read-only view of one instance in, a ``BatchPlan`` out.

Modelled on Vidur/sarathi-serve's ``BaseReplicaScheduler``: ``schedule`` is
their ``_get_next_batch``; ``on_batch_end`` runs after each iteration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from sloserve.batch import BatchPlan, ScheduledItem
from sloserve.request import Request

if TYPE_CHECKING:
    from sloserve.kv import BlockManager
    from sloserve.perf.base import PerfModel


@dataclass(slots=True)
class PolicyConfig:
    """Every knob any policy reads; each policy documents which ones it uses."""

    token_budget: int = 512  # Sarathi chunk/token budget per iteration
    max_num_seqs: int = 256  # vLLM max batch size (Ascendra LP uses 128)
    max_num_batched_tokens: int = 8192  # vLLM prefill token cap per iteration
    value_function: str = "edf"  # Ascendra LP ordering: edf | sjf | ljf | fcfs
    offload_threshold: float = 1.0  # Ascendra: offload when now + margin*worst_hp >= deadline
    hp_worst_batch_tokens: int = 2048  # Ascendra: tokens in the worst-case HP batch
    drop_late: bool = False  # Ascendra §6.3: drop requests already past their TTFT SLO
    long_prompt_threshold: int = 2048  # AccelGen ERA: prompts at least this long are "long"
    min_token_budget: int = 32  # AccelGen: floor of the dynamic budget
    max_token_budget: int = 4096  # AccelGen: ceiling of the dynamic budget
    extra: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("token_budget", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.value_function not in ("edf", "sjf", "ljf", "fcfs"):
            raise ValueError(
                f"value_function: must be one of edf, sjf, ljf, fcfs; got {self.value_function!r}"
            )


@dataclass(frozen=True, slots=True)
class InstanceView:
    """What a policy may look at. Policies must not mutate it."""

    instance_id: str
    now: float
    waiting: Sequence[Request]  # arrival order (preempted requests go to the front)
    running: Sequence[Request]  # hold KV: prefilling (chunked) or decoding, admission order
    kv: BlockManager
    perf_model: PerfModel
    role: str = "lp"  # "lp" | "hp" (Ascendra); other policies ignore it


class BatchBuilder:
    """Tentative batch under a token budget, a sequence cap and free KV blocks.

    Policies add items through it so that no plan can over-allocate KV or
    exceed its budget; ``Instance`` then applies the plan for real.
    """

    def __init__(self, view: InstanceView, token_budget: int, max_num_seqs: int) -> None:
        self.view = view
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.free_blocks = view.kv.num_free_blocks
        self._plan = BatchPlan()
        self._in_batch: set[str] = set()
        self._removed: set[str] = set()
        self.tokens_used = 0

    @property
    def tokens_left(self) -> int:
        return self.token_budget - self.tokens_used

    @property
    def num_seqs(self) -> int:
        return len(self._plan.items)

    def contains(self, req: Request) -> bool:
        return req.request_id in self._in_batch

    def removed(self, req: Request) -> bool:
        return req.request_id in self._removed

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        return self.view.kv.blocks_needed(req.request_id, req.num_computed + num_tokens)

    def fits(self, req: Request, num_tokens: int) -> bool:
        return self._blocks_if_fits(req, num_tokens) >= 0

    def _blocks_if_fits(self, req: Request, num_tokens: int) -> int:
        """Blocks ``req`` x ``num_tokens`` would take, or -1 if it does not fit."""
        rid = req.request_id
        if (
            num_tokens < 1
            or rid in self._in_batch
            or rid in self._removed
            or num_tokens > req.num_tokens - req.num_computed
            or num_tokens > self.token_budget - self.tokens_used
            or len(self._plan.items) >= self.max_num_seqs
        ):
            return -1
        need = self.view.kv.blocks_needed(rid, req.num_computed + num_tokens)
        return need if need <= self.free_blocks else -1

    def max_chunk(self, req: Request) -> int:
        """Largest chunk of ``req`` that fits the token budget and free KV (0 if none)."""
        if (
            req.request_id in self._in_batch
            or req.request_id in self._removed
            or self.num_seqs >= self.max_num_seqs
        ):
            return 0
        n = min(req.num_uncomputed, self.tokens_left)
        bs = self.view.kv.block_size
        have = self.view.kv.num_blocks_of(req.request_id)
        cap_tokens = (have + self.free_blocks) * bs - req.num_computed
        return max(0, min(n, cap_tokens))

    def add(self, req: Request, num_tokens: int) -> None:
        need = self._blocks_if_fits(req, num_tokens)
        if need < 0:
            raise ValueError(f"batch: {req.request_id} x{num_tokens} does not fit")
        self._append(req, num_tokens, need)

    def _append(self, req: Request, num_tokens: int, blocks: int) -> None:
        self.free_blocks -= blocks
        self.tokens_used += num_tokens
        self._in_batch.add(req.request_id)
        self._plan.items.append(
            ScheduledItem(req.request_id, num_tokens, req.num_computed, req.in_prefill)
        )

    def add_decodes_if_all_fit(self, decodes: Sequence[Request]) -> bool:
        """Fast path: add every decode at once when budget, slots and KV allow all of them.

        A running request holds exactly ``ceil(num_computed / block_size)`` blocks,
        so its next token needs a new block iff ``num_computed % block_size == 0``.
        """
        bs = self.view.kv.block_size
        need = sum(1 for r in decodes if r.num_computed % bs == 0)
        if (
            self._in_batch
            or self._removed
            or len(decodes) > self.token_budget - self.tokens_used
            or len(decodes) > self.max_num_seqs
            or need > self.free_blocks
        ):
            return False
        self.free_blocks -= need
        self.tokens_used += len(decodes)
        self._in_batch.update(r.request_id for r in decodes)
        self._plan.items.extend(
            ScheduledItem(r.request_id, 1, r.num_computed, False) for r in decodes
        )
        return True

    def _remove(self, req: Request, into: list[str]) -> None:
        if req.request_id in self._in_batch or req.request_id in self._removed:
            raise ValueError(f"batch: {req.request_id} is already scheduled or removed")
        self._removed.add(req.request_id)
        self.free_blocks += self.view.kv.num_blocks_of(req.request_id)
        into.append(req.request_id)

    def preempt(self, req: Request) -> None:
        """Preempt by recompute: its blocks return to the pool for this batch."""
        self._remove(req, self._plan.preempted)

    def offload(self, req: Request) -> None:
        self._remove(req, self._plan.offloaded)

    def drop(self, req: Request) -> None:
        self._remove(req, self._plan.dropped)

    def build(self) -> BatchPlan:
        return self._plan


def add_decodes(b: BatchBuilder, decodes: Sequence[Request]) -> None:
    """Give every running decode its next token, preempting by recompute when KV runs out.

    vLLM's rule: the victim is the most recently admitted running request
    (the tail of ``decodes``); a request with nobody left to evict preempts itself.
    """
    if b.add_decodes_if_all_fit(decodes):
        return
    queue = list(decodes)
    while queue:
        req = queue.pop(0)
        while b.blocks_needed(req, 1) > b.free_blocks:
            victim = queue.pop() if queue else req
            b.preempt(victim)
            if victim is req:
                break
        else:
            if b.fits(req, 1):
                b.add(req, 1)


def can_admit(b: BatchBuilder, req: Request, num_tokens: int, watermark: float = 0.01) -> bool:
    """Admission control for a new request (vLLM ``can_allocate`` with its 1% watermark).

    The whole remaining prompt must fit in free KV beside this batch, so an
    admitted prefill is never starved of blocks half-way.
    """
    reserve = int(watermark * b.view.kv.num_blocks)
    need_all = b.view.kv.blocks_for(req.num_tokens)
    return b.fits(req, num_tokens) and need_all <= b.free_blocks - reserve


class Policy(ABC):
    """A scheduling policy: one per file, registered by ``name``."""

    name: ClassVar[str]

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()

    def on_arrival(self, req: Request, now: float) -> None:  # noqa: B027 - optional hook
        """Called when ``req`` joins this instance (new, offloaded in, or restored)."""

    @abstractmethod
    def schedule(self, view: InstanceView) -> BatchPlan:
        """Form the next batch (Vidur's ``_get_next_batch``)."""

    def on_batch_end(self, view: InstanceView, plan: BatchPlan) -> None:  # noqa: B027
        """Called after the instance applied the iteration's results."""
