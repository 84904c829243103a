"""The policy seam (docs/design.md): a read-only view of one instance in, a ``BatchPlan`` out.

Modelled on Vidur/sarathi-serve's ``BaseReplicaScheduler``: ``schedule`` is
their ``_get_next_batch``; ``on_batch_end`` runs after each iteration.
"""

from __future__ import annotations

import math
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, replace
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from sloserve.batch import BatchPlan, BatchShape, ScheduledItem
from sloserve.defaults import TBT_SLO, default_token_budget
from sloserve.request import Request

if TYPE_CHECKING:
    from sloserve.kv import BlockManager
    from sloserve.perf.base import PerfModel


_new_item = partial(tuple.__new__, ScheduledItem)  # what ScheduledItem._make does, in C

C = TypeVar("C", bound="PolicyConfig")
B = TypeVar("B", bound="BudgetConfig")
_HINTS: dict[type, dict[str, Any]] = {}


def knob(default: Any, help: str, *, min: float | None = None, max: float | None = None,
         choices: Sequence[str] = ()) -> Any:
    """A policy config field: its default, its ``--flag`` help, and the rule it is checked by."""
    meta: dict[str, Any] = {"help": help}
    if min is not None:
        meta["min"] = min
    if max is not None:
        meta["max"] = max
    if choices:
        meta["choices"] = tuple(choices)
    return field(default=default, metadata=meta)


def knob_types(cls: type[PolicyConfig]) -> dict[str, Any]:
    """Each knob's annotation, evaluated (``int``, ``float``, ``bool``, ``str``, ``int | None``)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _of_kind(value: Any, kinds: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of the knob's types (a bool is no int; an int is a float)."""
    if isinstance(value, bool):
        return bool in kinds
    return ((int in kinds and isinstance(value, int))
            or (float in kinds and isinstance(value, (int, float)))
            or (str in kinds and isinstance(value, str)))


def _check_bounds(name: str, value: Any, meta: Mapping[str, Any]) -> None:
    """The knob's declared rule (``knob``'s ``choices``, ``min``, ``max``)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value}")
    if "choices" in meta and value not in meta["choices"]:
        raise ValueError(f"{name}: must be one of {', '.join(meta['choices'])}; got {value!r}")
    if "min" in meta and value < meta["min"]:
        raise ValueError(f"{name}: must be >= {meta['min']}, got {value}")
    if "max" in meta and value > meta["max"]:
        raise ValueError(f"{name}: must be <= {meta['max']}, got {value}")


def _check_knob(f: Field[Any], value: Any, hint: Any) -> Any:
    """``value`` if it is valid for knob ``f`` (an int given for a float knob becomes a float);
    else ``ValueError`` naming the field."""
    name = f.name
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) not in kinds:
            raise ValueError(f"{name}: must be set, got None")
        return value
    if not _of_kind(value, kinds):
        want = " or ".join(k.__name__ for k in kinds if k is not type(None))
        raise ValueError(f"{name}: must be {want}, got {value!r}")
    _check_bounds(name, value, f.metadata)
    if float in kinds and int not in kinds and not isinstance(value, float):
        return float(value)
    return value


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What every policy shares. Each policy declares a subclass next to it with its own
    knobs (``knob``: default, help, rule); a bad value raises ``ValueError`` naming the field."""

    max_num_seqs: int = knob(256, "most sequences in one batch (vLLM's max_num_seqs)", min=1)

    def __post_init__(self) -> None:
        hints = knob_types(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            checked = _check_knob(f, value, hints[f.name])
            if checked is not value:
                object.__setattr__(self, f.name, checked)  # frozen: the one normalisation
        self.check()

    def check(self) -> None:
        """Rules across fields (per-field ones are declared with ``knob``)."""

    def resolved(self: C, *, tbt_slo: float | None = TBT_SLO, slo_mix: str | None = None) -> C:
        """This config with every workload-dependent default (``None``) filled in."""
        return self

    def for_role(self: C, role: str, *, num_hp: int) -> C:
        """The config one instance of ``role`` runs, in a deployment with ``num_hp`` HP ones."""
        return self


@dataclass(frozen=True, slots=True)
class BudgetConfig(PolicyConfig):
    """A policy that fills a per-iteration token budget (Sarathi-Serve §4-§5 and its heirs)."""

    token_budget: int | None = knob(
        None, "tokens per iteration (default: 512 under a strict TBT SLO, < 0.25 s, else 2048; "
        "Sarathi-Serve §5)", min=1)

    def resolved(self: B, *, tbt_slo: float | None = TBT_SLO, slo_mix: str | None = None) -> B:
        if self.token_budget is not None:
            return self
        return replace(self, token_budget=default_token_budget(tbt_slo, slo_mix))

    @property
    def budget(self) -> int:
        """``token_budget``, or the default rule's under the default TBT SLO when unset."""
        if self.token_budget is not None:
            return self.token_budget
        return default_token_budget(TBT_SLO, None)


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
    timers: bool = False  # the driver honours an empty plan's ``wake_at``


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

    def shape(self) -> BatchShape:
        """The batch so far, as a perf model sees it."""
        return self._plan.shape()

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
        n = len(decodes)
        if (
            self._in_batch
            or self._removed
            or n > self.token_budget - self.tokens_used
            or n > self.max_num_seqs
        ):
            return False
        bs = self.view.kv.block_size
        computed = [r.num_computed for r in decodes]
        need = [c % bs for c in computed].count(0)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        self.tokens_used += n
        ids = [r.request_id for r in decodes]
        self._in_batch.update(ids)
        # C-level construction of ScheduledItem(rid, 1, computed, False) per decode
        self._plan.items.extend(map(_new_item, zip(ids, repeat(1), computed, repeat(False))))
        return True

    def _remove(self, req: Request, into: list[str]) -> None:
        if req.request_id in self._in_batch or req.request_id in self._removed:
            raise ValueError(f"batch: {req.request_id} is already scheduled or removed")
        self._removed.add(req.request_id)
        # shared prefix blocks stay with their other holders (prefix caching)
        self.free_blocks += self.view.kv.num_reclaimable(req.request_id)
        into.append(req.request_id)

    def preempt(self, req: Request) -> None:
        """Preempt by recompute: its blocks return to the pool for this batch."""
        self._remove(req, self._plan.preempted)

    def scheduled_blocks(self, req: Request) -> int:
        """New blocks ``req``'s item in this batch takes (0 if it has none)."""
        item = next((i for i in self._plan.items if i.request_id == req.request_id), None)
        if item is None:
            return 0
        return self.view.kv.blocks_needed(req.request_id, req.num_computed + item.num_tokens)

    def preempt_scheduled(self, req: Request) -> None:
        """Preempt ``req`` even if it is already in this batch: its item is taken out first
        (AccelGen Algorithm 1 lines 2-4 evict from the batch being formed)."""
        rid = req.request_id
        if rid in self._in_batch:
            item = next(i for i in self._plan.items if i.request_id == rid)
            self.free_blocks += self.scheduled_blocks(req)
            self.tokens_used -= item.num_tokens
            self._plan.items.remove(item)
            self._in_batch.discard(rid)
        self.preempt(req)

    def offload(self, req: Request) -> None:
        self._remove(req, self._plan.offloaded)

    def drop(self, req: Request, reason: str | None = None) -> None:
        """End ``req`` as dropped; ``reason`` (if given) is what the client is told."""
        self._remove(req, self._plan.dropped)
        if reason is not None:
            self._plan.drop_reasons[req.request_id] = reason

    def build(self) -> BatchPlan:
        return self._plan


def add_decodes(b: BatchBuilder, decodes: Sequence[Request]) -> None:
    """Give every running decode its next token, preempting by recompute when KV runs out.

    vLLM's rule (V0 ``Scheduler._schedule``: ``policy.sort_by_priority`` sorts the
    running queue FCFS by arrival, the front is served first, victims are
    ``running.pop()``): the victim is the running request that arrived last;
    a request with nobody left to evict preempts itself.
    The victims re-enter the waiting queue's front in arrival order (``Instance``).
    """
    if b.add_decodes_if_all_fit(decodes):
        return
    queue = sorted(decodes, key=lambda r: r.arrival_time)  # stable: admission order on ties
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


def add_decodes_evicting(b: BatchBuilder, decodes: Sequence[Request],
                         victims: Sequence[Request]) -> None:
    """Give each decode its next token; when KV runs out, preempt from the end of
    ``victims`` (a policy's order, least worth keeping last), skipping requests already
    batched or removed; a decode that is its own victim yields (AccelGen, the oracle)."""
    order = list(victims)
    for req in decodes:
        if b.removed(req):
            continue
        while b.blocks_needed(req, 1) > b.free_blocks:
            while b.contains(order[-1]) or b.removed(order[-1]):
                order.pop()
            victim = order.pop()
            b.preempt(victim)
            if victim is req:
                break
        else:
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
    """A scheduling policy: one per file, reached through its ``PolicySpec`` (registry)."""

    name: ClassVar[str]
    config_cls: ClassVar[type[PolicyConfig]] = PolicyConfig
    # False promises that no method ever reads ``view.perf_model``: the instance's decisions
    # then never depend on the online model every instance's batches refit, so its
    # instances may be simulated apart (``sim.split``, ``--workers``)
    reads_perf_model: ClassVar[bool] = True

    def __init__(self, config: PolicyConfig | None = None) -> None:
        cfg = self.config_cls() if config is None else config
        if not isinstance(cfg, self.config_cls):
            raise ValueError(f"config: {type(self).__name__} takes a {self.config_cls.__name__}, "
                             f"got a {type(cfg).__name__}")
        self.config = cfg

    def on_arrival(self, req: Request, now: float) -> None:  # noqa: B027 - optional hook
        """Called when ``req`` joins this instance (new, offloaded in, or restored)."""

    def on_requeued(self, reqs: Sequence[Request]) -> None:  # noqa: B027 - optional hook
        """Called when running ``reqs`` went back to the waiting queue's front, in this
        order, outside a plan (the executor was lost: ``Instance.preempt_all``)."""

    @abstractmethod
    def schedule(self, view: InstanceView) -> BatchPlan:
        """Form the next batch (Vidur's ``_get_next_batch``)."""

    def steady_decodes(self) -> int:
        """Steady state (``sloserve.sim.steady``): the most running requests ``n`` for which
        this policy promises that, whenever its waiting queue is empty, every running
        request is decoding (``not in_prefill``) and free KV has a block for each decode
        that needs one, ``schedule`` plans every running decode (one token each, running
        order) and nothing else, at any ``now``, and changes no state of its own.
        0 (the default): no such promise; every iteration asks ``schedule``."""
        return 0

    def offers_ticket(self, view: InstanceView) -> bool:
        """Ascendra §6.1: whether this (HP) instance invites a new request now."""
        return True

    def on_batch_end(self, view: InstanceView, plan: BatchPlan) -> None:  # noqa: B027
        """Called after the instance applied the iteration's results."""
