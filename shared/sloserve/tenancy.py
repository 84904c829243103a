"""Per-tenant limits at the door: each API key's requests in flight and token rate.

Admission control (``sloserve.admission``) is per instance: it sheds what its queue
cannot serve in time, whoever sent it, so one key's flood gets every other key shed
(issue 36, item 7). The gateway therefore first holds each key to its own share:

* ``max_inflight`` requests in flight at once (vLLM-based stacks' per-key concurrency
  limit; ``--max-inflight-per-key``);
* a token bucket over prompt + ``max_tokens`` tokens (``--key-token-rate`` tokens/s,
  ``--key-token-burst`` deep; the rate limit OpenAI's API states in tokens per minute):
  a request passes when the key's bucket holds its cost (or is full, for a request
  bigger than the bucket), then the cost is taken, possibly into debt, so a key's
  long-run rate never exceeds the configured one.

A refusal says when to retry (``retry_after_s``: when the bucket will hold the cost;
for the in-flight bound, which ends when one of the key's requests does, a fixed
``INFLIGHT_RETRY_S``). Pure: callers pass ``now``; no refusal changes any state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_BURST_S = 10.0  # a bucket holds this many seconds of the rate, unless told
INFLIGHT_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """The limits every key is held to (0 turns a limit off)."""

    max_inflight: int = 0
    token_rate: float = 0.0  # tokens/s of prompt + max_tokens
    token_burst: float = 0.0  # the bucket's depth; 0: token_rate x DEFAULT_BURST_S

    def __post_init__(self) -> None:
        m = self.max_inflight
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"max_inflight_per_key: must be an integer >= 0 (0: no bound), "
                             f"got {m!r}")
        for name in ("token_rate", "token_burst"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"key_{name}: must be a finite number >= 0 (0: off), got {v!r}")

    @property
    def on(self) -> bool:
        return bool(self.max_inflight or self.token_rate)

    @property
    def burst(self) -> float:
        return self.token_burst or self.token_rate * DEFAULT_BURST_S


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    retry_after_s: float


@dataclass(slots=True)
class _Key:
    inflight: int = 0
    level: float = 0.0  # tokens in the bucket (negative: debt)
    at: float = field(default=-math.inf)  # when ``level`` was last brought up to date


class TenantLimiter:
    """Each key's in-flight count and token bucket under one :class:`KeyLimits`."""

    def __init__(self, limits: KeyLimits) -> None:
        self.limits = limits
        self.keys: dict[str, _Key] = {}

    def _level(self, k: _Key, now: float) -> float:
        burst = self.limits.burst
        if k.at == -math.inf:
            return burst  # a key's first request finds its bucket full
        return min(burst, k.level + max(0.0, now - k.at) * self.limits.token_rate)

    def acquire(self, key: str, cost: int, now: float) -> Refused | None:
        """Admit one request of ``cost`` tokens for ``key`` (``None``) or say why not; an
        admitted request holds an in-flight slot until :meth:`release`."""
        lim = self.limits
        k = self.keys.get(key) or _Key()
        if lim.max_inflight and k.inflight >= lim.max_inflight:
            return Refused(f"shed: this API key has {k.inflight} requests in flight "
                           f"(max_inflight_per_key {lim.max_inflight})", INFLIGHT_RETRY_S)
        if lim.token_rate:
            level, need = self._level(k, now), min(float(cost), lim.burst)
            if level < need:
                wait = (need - level) / lim.token_rate
                return Refused(f"shed: this API key is over its token rate ({cost} tokens "
                               f"asked, {max(0.0, level):.0f} available; key_token_rate "
                               f"{lim.token_rate:g}/s)", wait)
            k.level, k.at = level - cost, now
        k.inflight += 1
        self.keys[key] = k
        return None

    def release(self, key: str) -> None:
        """One of ``key``'s admitted requests ended (finished, dropped or cancelled)."""
        k = self.keys.get(key)
        if k is None:
            return
        k.inflight = max(0, k.inflight - 1)
        if k.inflight == 0 and (not self.limits.token_rate or k.level >= self.limits.burst):
            del self.keys[key]  # nothing to remember: a full bucket is the default
