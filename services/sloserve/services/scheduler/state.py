"""A scheduler's durable state in Redis: accepted requests and their generated tokens.

* ``inst:<instance>:req:<id>``: the ``RequestSpec`` (protobuf bytes) of each accepted request;
* ``inst:<instance>:tok:<id>``: its generated token ids, appended per iteration;
* ``inst:<instance>:queue``: the instance's accepted, unfinished ids by arrival.

Writes are queued (token appends coalesced into one RPUSH per request) and
sent, in order, in short pipelines by a background task
that the iteration loop kicks right after a plan leaves for the executor (at
most every ``FLUSH_INTERVAL_S``), so Redis work overlaps the batch instead of
delaying the next plan, and the loop never waits on Redis. A write lost in a
crash is harmless: the gateway re-announces its in-flight requests
on reconnect (``Hello``) and token indices make replays idempotent.

Redis outages: the scheduler keeps serving from memory (the core ``Instance`` is
the record). When a flush fails, the queued writes are discarded and the writer
retries, with backoff, a *snapshot* instead: every live request's spec and
tokens (``live``), and the removal of every id Redis lists that is no longer
live. A snapshot is idempotent (SET, DEL + RPUSH of all tokens, ZADD), so it is
safe to resend whether the failed pipeline ran, half ran or never ran, and it
restores durability whether Redis came back with its data or empty. Memory is
bounded by the live requests (nothing accumulates while Redis is down but the
writes queued since the last attempt, which the next snapshot supersedes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from sloserve.services.proto import common_pb2
from sloserve.services.redisconn import REDIS_ERRORS, Outage
from sloserve.services.store import Keys

Op = Callable[[Pipeline], object]
Live = Callable[[], Iterable[tuple[common_pb2.RequestSpec, list[int]]]]  # (spec, tokens)
FLUSH_INTERVAL_S = 0.02
PIPELINE_OPS = 32  # ops per pipeline: the event loop runs between pipelines (the next
# executor result is not held up behind one long command-packing stretch)


class RequestStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys, instance_id: str) -> None:
        self.redis, self.keys, self.instance_id = redis, keys, instance_id
        self._ops: list[Op] = []
        self._tokens: dict[str, list[int]] = {}  # appended since their last queued op
        self._last_flush = 0.0
        self._wanted = asyncio.Event()
        self.live: Live = lambda: ()  # the scheduler binds its requests (snapshots)
        self.dirty = False  # a flush failed: Redis may lack or hold stale writes
        self.outage = Outage("scheduler_state")
        self.snapshots = 0

    async def restore(self) -> list[tuple[common_pb2.RequestSpec, list[int]]]:
        """Every accepted, unfinished request of this instance, by arrival."""
        ids: Any = await self.redis.zrange(self.keys.queue(self.instance_id), 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for rid in ids:
                pipe.get(self.keys.request(self.instance_id, rid.decode()))
                pipe.lrange(self.keys.tokens(self.instance_id, rid.decode()), 0, -1)
            raw = await pipe.execute()
        out = []
        for spec_raw, toks in zip(raw[::2], raw[1::2]):
            if spec_raw is not None:
                out.append((common_pb2.RequestSpec.FromString(spec_raw), [int(t) for t in toks]))
        return out

    # --- queued writes ---------------------------------------------------------
    def _queue(self, request_id: str, op: Op) -> None:
        """Queue ``op`` after the request's pending tokens (per-key order is kept)."""
        toks = self._tokens.pop(request_id, None)
        if toks:
            self._ops.append(self._push(request_id, toks))
        self._ops.append(op)

    def _push(self, request_id: str, tokens: list[int]) -> Op:
        key = self.keys.tokens(self.instance_id, request_id)
        return lambda p: p.rpush(key, *tokens)

    def accept(self, spec: common_pb2.RequestSpec) -> None:
        rid, k, i = spec.request_id, self.keys, self.instance_id
        raw = spec.SerializeToString()

        def op(p: Pipeline) -> None:
            p.set(k.request(i, rid), raw)
            p.delete(k.tokens(i, rid))
            if spec.generated_token_ids:
                p.rpush(k.tokens(i, rid), *spec.generated_token_ids)
            p.zadd(k.queue(self.instance_id), {rid: spec.arrival_time})

        self._queue(rid, op)

    def append_tokens(self, tokens: dict[str, int]) -> None:
        """Coalesced: one RPUSH per request per flush, whatever the iterations since."""
        pending = self._tokens
        for r, t in tokens.items():
            if (toks := pending.get(r)) is None:
                pending[r] = [t]
            else:
                toks.append(t)

    def forget(self, request_id: str) -> None:
        self._queue(request_id, self._drop_op(request_id))

    def _drop_op(self, request_id: str) -> Op:
        k, i = self.keys, self.instance_id

        def op(p: Pipeline) -> None:
            p.delete(k.request(i, request_id), k.tokens(i, request_id))
            p.zrem(k.queue(i), request_id)

        return op

    async def flush(self) -> None:
        """Send every queued write, in order, in pipelines of ``PIPELINE_OPS``; after
        a failed flush, a snapshot instead (raises the Redis error if it fails)."""
        if self.dirty:
            await self.snapshot()
            return
        ops, self._ops = self._ops, []
        ops += [self._push(r, toks) for r, toks in self._tokens.items()]
        self._tokens = {}
        try:
            await self._send(ops)
        except REDIS_ERRORS:
            self.dirty = True
            raise

    async def _send(self, ops: list[Op]) -> None:
        for k in range(0, len(ops), PIPELINE_OPS):
            async with self.redis.pipeline(transaction=False) as pipe:
                for op in ops[k:k + PIPELINE_OPS]:
                    op(pipe)
                await pipe.execute()

    async def snapshot(self) -> None:
        """Make Redis hold exactly the live requests (idempotent; clears ``dirty``)."""
        self._ops, self._tokens = [], {}  # superseded by the state read just below
        live = {spec.request_id: (spec, list(tokens)) for spec, tokens in self.live()}
        k, i = self.keys, self.instance_id
        ops: list[Op] = []
        for rid, (spec, tokens) in live.items():
            raw = spec.SerializeToString()

            def put(p: Pipeline, rid: str = rid, raw: bytes = raw, toks: list[int] = tokens,
                    at: float = spec.arrival_time) -> None:
                p.set(k.request(i, rid), raw)
                p.delete(k.tokens(i, rid))
                if toks:
                    p.rpush(k.tokens(i, rid), *toks)
                p.zadd(k.queue(i), {rid: at})

            ops.append(put)
        known: Any = await self.redis.zrange(k.queue(i), 0, -1)
        for raw_id in known:
            rid = raw_id.decode()
            if rid not in live:
                ops.append(self._drop_op(rid))
        await self._send(ops)
        self.dirty = False
        self.snapshots += 1

    def kick(self, now: float, interval: float = FLUSH_INTERVAL_S) -> None:
        """Let the writer send what is queued (``now``: a monotonic clock)."""
        if (self._ops or self._tokens) and now - self._last_flush >= interval:
            self._last_flush = now
            self._wanted.set()

    async def flush_forever(self) -> None:
        """Send queued writes when kicked; through a Redis outage, retry with backoff
        (snapshots) until Redis is back. Never raises a Redis error."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.flush()
            except REDIS_ERRORS as exc:
                await self.outage.failed(exc)
                await self.outage.until_ok(self.snapshot)

    async def close(self, timeout: float) -> None:
        """Best-effort final flush on shutdown (Redis may be down: then nothing is sent)."""
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except (RedisError, TimeoutError) as exc:
            self.outage.log.warning("final_flush_failed", error=f"{type(exc).__name__}: {exc}")
