"""Client input checks at the gateway: every error names the field that is wrong."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

from sloserve.services.proto import common_pb2, gateway_pb2


class InvalidInput(ValueError):
    """Bad client input; the message starts with the field name."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens_total: int  # prompt + max_tokens must fit (model context and KV capacity)
    vocab_size: int


def check_sampling(s: common_pb2.Sampling, vocab_size: int) -> None:
    """vLLM's SamplingParams ranges."""
    if s.HasField("temperature") and not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise InvalidInput(f"sampling.temperature: must be >= 0, got {s.temperature}")
    if s.HasField("top_p") and not 0 < s.top_p <= 1:
        raise InvalidInput(f"sampling.top_p: must be in (0, 1], got {s.top_p}")
    if s.HasField("top_k") and s.top_k < 0:
        raise InvalidInput(f"sampling.top_k: must be >= 0 (0 disables), got {s.top_k}")
    bad = [t for t in s.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidInput(f"sampling.stop_token_ids: {bad[:3]} outside [0, {vocab_size})")


def request_spec(
    r: gateway_pb2.GenerateRequest, ids: list[int], limits: Limits,
    slo_defaults: dict[str, float | None], now: float,
) -> common_pb2.RequestSpec:
    """The scheduler-facing spec of a client request (``ids``: its prompt tokens)."""
    if not ids:
        raise InvalidInput("prompt: must not be empty")
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise InvalidInput(
            f"prompt_token_ids: {bad[:3]} outside the vocabulary [0, {limits.vocab_size})")
    if r.max_tokens < 1:
        raise InvalidInput(f"max_tokens: must be >= 1, got {r.max_tokens}")
    if len(ids) + r.max_tokens > limits.max_tokens_total:
        raise InvalidInput(
            f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({r.max_tokens}) exceeds "
            f"the limit of {limits.max_tokens_total} tokens")
    check_sampling(r.sampling, limits.vocab_size)
    spec = common_pb2.RequestSpec(
        request_id=r.request_id or uuid.uuid4().hex, prompt_token_ids=ids,
        max_tokens=r.max_tokens, priority=r.priority, arrival_time=now, dispatch_time=now,
        sampling=r.sampling)
    for name in ("ttft_slo", "tbt_slo", "jct_slo"):
        value = getattr(r, name) if r.HasField(name) else slo_defaults.get(name)
        if value is not None:
            if not (math.isfinite(value) and value > 0):
                raise InvalidInput(f"{name}: must be a positive number of seconds, got {value}")
            setattr(spec, name, value)
    return spec
