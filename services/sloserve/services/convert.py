"""Core types <-> protobuf messages (no decisions here, only field copies)."""

from __future__ import annotations

from sloserve.batch import BatchShape
from sloserve.request import SLO, Request
from sloserve.services.proto import common_pb2


def _opt(msg: object, name: str) -> float | None:
    return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]


def slo_of(msg: object) -> SLO:
    """SLO from any message with optional ``ttft_slo``/``tbt_slo``/``jct_slo`` fields."""
    return SLO(ttft=_opt(msg, "ttft_slo"), tbt=_opt(msg, "tbt_slo"), jct=_opt(msg, "jct_slo"))


def request_of(spec: common_pb2.RequestSpec) -> Request:
    """The core ``Request`` for a spec; already-generated tokens will be recomputed."""
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
    req.num_generated = len(spec.generated_token_ids)
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
