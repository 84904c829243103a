"""Core types <-> protobuf messages: the one place for them (no decisions, field copies)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sloserve.batch import BatchPlan, BatchShape
from sloserve.instance import Instance, TokenEvent
from sloserve.kv_prefix import token_hash_ids
from sloserve.request import SLO, Request
from sloserve.services.proto import common_pb2, executor_pb2, scheduler_pb2


def _opt(msg: object, name: str) -> float | None:
    return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]


def slo_of(msg: object) -> SLO:
    """SLO from any message with optional ``ttft_slo``/``tbt_slo``/``jct_slo`` fields (and
    ``default_slos``: those the gateway filled in)."""
    defaulted = frozenset(getattr(msg, "default_slos", ()))
    return SLO(ttft=_opt(msg, "ttft_slo"), tbt=_opt(msg, "tbt_slo"), jct=_opt(msg, "jct_slo"),
               defaulted=defaulted)


def request_of(spec: common_pb2.RequestSpec, hash_unit: int | None = None) -> Request:
    """The core ``Request`` for a spec; already-generated tokens will be recomputed.
    ``hash_unit``: give it a prefix identity from its prompt token ids, one id per
    ``hash_unit`` tokens (the KV block size: prefix caching, ``sloserve.kv_prefix``)."""
    req = Request(
        request_id=spec.request_id,
        arrival_time=spec.arrival_time,
        prompt_len=len(spec.prompt_token_ids),
        output_len=spec.max_tokens,
        slo=slo_of(spec),
        priority=spec.priority,
        num_offloads=spec.num_offloads,
        origin_instance=spec.origin_instance or None,
    )
    if hash_unit is not None:
        req.hash_ids = token_hash_ids(spec.prompt_token_ids, hash_unit)
        req.hash_unit = hash_unit
    req.num_generated = len(spec.generated_token_ids)
    req.output_token_ids = list(spec.generated_token_ids)
    return req


def shape_to_proto(shape: BatchShape) -> common_pb2.BatchShape:
    return common_pb2.BatchShape(
        prefills=[common_pb2.PrefillChunk(chunk_len=c, context_len=x) for c, x in shape.prefills],
        decodes=list(shape.decodes),
    )


def shape_of(msg: common_pb2.BatchShape) -> BatchShape:
    return BatchShape(
        prefills=tuple((p.chunk_len, p.context_len) for p in msg.prefills),
        decodes=tuple(msg.decodes),
    )


class TableDeltas:
    """What one executor stream already holds of each request's KV block table, so a
    plan carries only the blocks appended since (``PlanItem.new_blocks``) and a whole
    table only where the executor holds none (issue 14: plans as deltas).

    One per executor stream (a new stream starts empty: the executor resets). A
    table is forgotten with the plan that frees, preempts or (re)adds its request,
    as the executor forgets it; tables only grow in between (``BlockManager``)."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: dict[str, int] = {}  # request -> blocks the executor holds

    def reset(self) -> None:
        self.known.clear()


def plan_to_proto(
    instance: Instance, plan: BatchPlan, specs: Mapping[str, common_pb2.RequestSpec],
    iteration: int, start_time: float, freed: Iterable[str], tables: TableDeltas | None,
) -> executor_pb2.BatchPlan:
    """The executor's view of a plan (before ``Instance.complete`` advances progress).

    A chunk that starts at context 0 (a new, preempted or moved request) carries
    the whole sequence in ``added``: prompt plus tokens generated so far, recomputed;
    so does one that starts over a prefix-cache hit (``context_len == num_cached``: the
    executor starts it over the cached blocks its table begins with).
    ``tables``: block tables as deltas against what the stream holds (``TableDeltas``,
    updated here); ``None``: no block tables (the sim executor needs none).
    """
    msg = executor_pb2.BatchPlan(iteration=iteration, start_time=start_time, freed=freed,
                                 preempted=plan.preempted)
    kv = instance.kv
    known = tables.known if tables is not None else None
    if known is not None:
        for rid in msg.freed:
            known.pop(rid, None)
        for rid in plan.preempted:
            known.pop(rid, None)
    add_item = msg.items.add
    for it in plan.items:
        rid = it.request_id
        req = instance.requests[rid]
        item = add_item(
            request_id=rid, num_tokens=it.num_tokens, context_len=it.context_len,
            is_prefill=it.is_prefill, samples_token=req.samples_after(it.num_tokens),
            token_index=req.num_generated,
        )
        starts = it.context_len == req.num_cached  # 0 without a prefix-cache hit
        if known is not None:
            held = None if starts else known.get(rid)
            size = kv.num_blocks_of(rid)
            if held is None or held > size:  # the executor holds none (or a stale one)
                item.block_table.extend(kv.blocks_from(rid, 0))
            elif held < size:
                item.new_blocks.extend(kv.blocks_from(rid, held))
            known[rid] = size
        if starts:
            spec = specs[rid]
            msg.added.add(request_id=rid, prompt_token_ids=spec.prompt_token_ids,
                          generated_token_ids=req.output_token_ids or (),
                          max_tokens=spec.max_tokens, sampling=spec.sampling)
    return msg


def tokens_to_proto(
    events: Iterable[TokenEvent], stopped: Iterable[str], out: scheduler_pb2.SchedulerOutput,
    requests: Mapping[str, Request] | None = None,
    logprobs: Mapping[str, common_pb2.TokenLogprobs] | None = None,
) -> None:
    """``requests``: the instance's, to stamp a first token with its request's queue and
    prefill time (vLLM's, exported on the API port; issue 35, item 3); ``logprobs``: the
    executor's, by request (issue 35, item 2)."""
    stop = set(stopped) if stopped else ()
    add = out.tokens.add
    for ev in events:
        t = add(request_id=ev.request_id, index=ev.index, token_id=ev.token_id, time=ev.time,
                finished=ev.finished, stopped=ev.request_id in stop)
        if logprobs and (lp := logprobs.get(ev.request_id)) is not None:
            t.logprobs.CopyFrom(lp)
        r = requests.get(ev.request_id) if ev.index == 0 and requests is not None else None
        if r is not None and r.first_scheduled_time is not None:
            t.queue_time = max(0.0, r.first_scheduled_time - r.arrival_time)
            t.prefill_time = max(0.0, ev.time - r.first_scheduled_time)


def state_to_proto(instance: Instance, now: float) -> scheduler_pb2.InstanceState:
    kv = instance.kv
    return scheduler_pb2.InstanceState(
        instance_id=instance.instance_id, num_waiting_prefills=instance.num_waiting_prefills,
        time=now, declines_ticket=not instance.policy.offers_ticket(instance.view(now)),
        prefix_query_tokens=getattr(kv, "num_query_tokens", 0),
        prefix_hit_tokens=getattr(kv, "num_hit_tokens", 0),
        num_running=len(instance.running), num_waiting=len(instance.waiting),
        kv_used_blocks=kv.num_used_blocks, kv_num_blocks=kv.num_blocks,
        num_preemptions=instance.num_preemptions)
