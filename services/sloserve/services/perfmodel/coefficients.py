"""Published coefficients: a JSON value under ``Keys.coefficients`` and a pub/sub message
on the channel of the same name. Schedulers load the key, then follow the channel, and
predict locally (no RPC per decision). Through a Redis outage a follower keeps the
coefficients it has and resubscribes (then reloads the key) when Redis is back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis

from sloserve.perf.hardware import Hardware, get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.regression import AscendraRegression
from sloserve.services.proto import perfmodel_pb2
from sloserve.services.redisconn import REDIS_ERRORS, Outage


@dataclass(slots=True)
class Published:
    values: list[float]
    version: int
    num_samples: int
    fit_time: float
    model: str
    hardware: str
    mape: float
    refit_interval_s: float = 0.0  # the service's --refit-interval (0: not said)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Published:
        """Parse and check a published fit (``ValueError`` naming the field if it is not)."""
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("coefficients: not a JSON object")
        p = cls(**obj)
        if not isinstance(p.values, list) or not all(
                isinstance(v, (int, float)) and math.isfinite(v) for v in p.values):
            raise ValueError("coefficients: values must be a list of finite numbers")
        return p

    def to_proto(self) -> perfmodel_pb2.Coefficients:
        return perfmodel_pb2.Coefficients(**asdict(self))


def regression_for(model: str, hardware: str, window: int = 4096) -> AscendraRegression:
    """The regression both the perf-model service and the schedulers use.

    A hardware name outside the table (e.g. ``cpu`` before ``sloserve profile``
    registered it) gets nominal peaks: the fitted coefficients absorb the scale,
    and both sides build the same one, so published coefficients stay valid.
    """
    try:
        hw = get_hardware(hardware)
    except ValueError:
        hw = Hardware(hardware, peak_flops=1e12, mem_bandwidth=1e11, mem_bytes=0.0)
    return AscendraRegression(get_model(model), hw, window=window, refit_every=10**9)


async def follow(
    redis: aioredis.Redis, key: str, apply: Callable[[Published], None], wait_s: float = 0.0,
    outage: Outage | None = None,
) -> asyncio.Task[None]:
    """Apply the current coefficients (waiting up to ``wait_s`` for a first fit, or for
    Redis), then keep applying every update in a background task, which is returned.
    The task never ends on a Redis error: it resubscribes with backoff. A message (or
    value) that is not a valid fit is logged and skipped."""
    outage = outage or Outage("coefficients")
    applied = asyncio.Event()

    def take(raw: bytes | str) -> None:
        try:  # anyone who can PUBLISH may send anything: a bad message is skipped
            apply(Published.from_json(raw))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            outage.log.warning("coefficients_malformed", key=key, size=len(raw),
                               error=f"{type(exc).__name__}: {exc}"[:200])
            return
        applied.set()

    async def follow_once() -> None:
        pubsub = redis.pubsub()
        try:
            await pubsub.subscribe(key)  # first: no fit published after the GET is missed
            raw = await redis.get(key)
            outage.ok()
            if raw is not None:
                take(raw)
            async for msg in pubsub.listen():
                if msg["type"] == "message":
                    take(msg["data"])
        finally:
            with contextlib.suppress(*REDIS_ERRORS, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def run() -> None:
        while True:
            try:
                await follow_once()
            except REDIS_ERRORS as exc:
                await outage.failed(exc)
                await asyncio.sleep(outage.delay())

    task = asyncio.create_task(run())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(applied.wait(), wait_s)
    return task
