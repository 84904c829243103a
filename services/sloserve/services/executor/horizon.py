"""The virtual clock's executor side: a batch's result waits for the horizon.

With ``--clock virtual`` a sim executor does not sleep a batch's time: the batch
ends at ``plan.start_time + duration`` in virtual time, and its result is held
until a conductor (a protocol test, ``tests/services/conductor.py``) moves the
horizon (``Keys.clock``, published on the channel of the same name) to that
end. The executor reports the end it holds in ``Keys.clock_held`` so the
conductor can advance time event by event, in the simulator's global order.
"""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aioredis

from sloserve.services.store import Keys


class Horizon:
    def __init__(self, redis: aioredis.Redis, keys: Keys, name: str) -> None:
        self.redis, self.keys, self.name = redis, keys, name
        self.value = float("-inf")
        self._moved = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.keys.clock)
        raw = await self.redis.get(self.keys.clock)
        if raw is not None:
            self._set(float(raw))
        await self.redis.hset(self.keys.clock_held, self.name, "")
        self._task = asyncio.create_task(self._follow(pubsub))

    async def _follow(self, pubsub: aioredis.client.PubSub) -> None:
        async for msg in pubsub.listen():
            if msg.get("type") == "message":
                with contextlib.suppress(ValueError):
                    self._set(float(msg["data"]))

    def _set(self, value: float) -> None:
        if value > self.value:
            self.value = value
            self._moved.set()

    async def wait_for(self, end: float) -> None:
        """Hold until the horizon reaches ``end`` (reporting the held end meanwhile)."""
        await self.redis.hset(self.keys.clock_held, self.name, repr(end))
        while self.value < end:
            self._moved.clear()
            await self._moved.wait()

    async def released(self) -> None:
        await self.redis.hset(self.keys.clock_held, self.name, "")
