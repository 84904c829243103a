"""The executor's sample flusher survives a Redis that stops answering: the commands
time out (``redis.exceptions.TimeoutError``, the error that once ended a ``vllm``
executor mid-run, docs/lab/vs-vllm.md), the samples wait in memory, and they reach the
stream once Redis answers again."""

from __future__ import annotations

import asyncio
import os
import signal

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from sloserve.batch import BatchSample, BatchShape
from sloserve.services.drills.redis_server import ThrowawayRedis
from sloserve.services.executor.backends import make_backend
from sloserve.services.executor.server import ExecutorService
from sloserve.services.store import Keys


async def _flush_through_a_stalled_redis(server: ThrowawayRedis) -> tuple[int, int, bool]:
    assert server.proc is not None
    # the services' client (redisconn.connect: no command retries) with a read timeout,
    # so a Redis that does not answer raises TimeoutError as a loaded one once did
    client = aioredis.Redis(port=server.port, socket_timeout=0.2, socket_connect_timeout=0.2,
                            retry=Retry(NoBackoff(), 0))
    svc = ExecutorService(make_backend("sim", model="llama-3-8b", gpu="a100"), client,
                          Keys("flush-test"))
    flusher = asyncio.create_task(svc.flush_forever())
    shape = BatchShape(((64, 0),), (128,) * 4)
    os.kill(server.proc.pid, signal.SIGSTOP)  # Redis stops answering
    try:
        for _ in range(5):
            svc._pending.append(BatchSample(shape, 0.01))
            svc._flush_wanted.set()
            await asyncio.sleep(0.3)
        failures = svc.outage.failures
        held = len(svc._held)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    for _ in range(100):  # Redis is back: the held samples go out
        if not svc._held and not svc.outage.down:
            break
        await asyncio.sleep(0.1)
    alive = not flusher.done()
    flusher.cancel()
    await client.aclose()
    return failures, held, alive


def test_sample_flush_survives_redis_timeouts_and_sends_the_held_samples_after(
    throwaway_redis: ThrowawayRedis,
) -> None:
    failures, held, alive = asyncio.run(_flush_through_a_stalled_redis(throwaway_redis))
    assert failures >= 1  # the flushes really timed out
    assert held >= 1  # and their samples were kept
    assert alive  # the flusher (and so the executor) did not end
    r = redis.Redis(port=throwaway_redis.port)
    # every sample arrived once Redis answered (at least once: a pipeline that timed out
    # may still run when Redis reads its socket again)
    assert r.xlen(Keys("flush-test").samples) >= 5
    r.close()
