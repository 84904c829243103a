"""Executor service: ``Execute`` (bidi: ``BatchPlan`` in, ``IterationResult`` out), ``Describe``.

Every executed batch (shape + measured time) is appended to the samples
stream for the perf-model service, in the background, off the iteration path.
At startup the backend's profiling sweep is appended first (warm start).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import redis.asyncio as aioredis

from sloserve.batch import BatchSample
from sloserve.services import obs, rpc
from sloserve.services.executor.backends import BACKENDS, Backend, make_backend, plan_shape
from sloserve.services.perfmodel import samples
from sloserve.services.proto import SERVICE_NAMES, executor_grpc, executor_pb2
from sloserve.services.store import Keys

FLUSH_INTERVAL_S = 0.1


SPIN_S = 0.002  # the last stretch of a wait is a blocking sleep: asyncio's timer is ms-coarse


async def _wait_until(deadline: float) -> None:
    """Sleep until ``deadline`` (perf_counter): asyncio for the bulk, keeping the loop
    responsive, then ``time.sleep`` (about 0.2 ms late instead of asyncio's 0.7 ms)."""
    left = deadline - time.perf_counter()
    if left > SPIN_S:
        await asyncio.sleep(left - SPIN_S)
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class ExecutorService(executor_grpc.ExecutorServicer):  # type: ignore[misc]  # generated
    def __init__(self, backend: Backend, redis: aioredis.Redis, keys: Keys) -> None:
        self.backend = backend
        self.redis = redis
        self.keys = keys
        self._pending: list[BatchSample] = []
        self._flush_wanted = asyncio.Event()
        self.log = obs.setup_logging("executor")

    async def Describe(
        self, request: executor_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ExecutorDescription:
        return self.backend.describe()

    async def Execute(
        self, request_iterator: AsyncIterator[executor_pb2.BatchPlan],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[executor_pb2.IterationResult]:
        self.backend.reset()
        async for plan in request_iterator:
            start = time.perf_counter()
            step = self.backend.execute(plan)
            # the reply is built while the batch runs (sim: before its wait), so only
            # the send is left once the batch is done
            result = executor_pb2.IterationResult(
                iteration=plan.iteration,
                tokens=[
                    executor_pb2.SampledToken(request_id=r, token_id=t)
                    for r, t in step.tokens.items()
                ],
                stopped=sorted(step.stopped),
                kv_used_blocks=sum(len(i.block_table) for i in plan.items),
            )
            shape = plan_shape(plan) if plan.items else None
            if step.realtime_wait:  # sim: really wait the batch's time, minus our own work
                await _wait_until(start + step.duration_s)
                measured = time.perf_counter() - start
            else:
                measured = step.duration_s
            result.duration_s = measured
            yield result
            if shape is not None:
                self._pending.append(BatchSample(shape, measured))
                self._flush_wanted.set()

    async def publish_warmup(self) -> None:
        sweep = await asyncio.to_thread(self.backend.warmup_samples)
        await self._xadd(sweep, "sweep")
        self.log.info("warmup_samples", count=len(sweep))

    async def flush_forever(self) -> None:
        while True:
            await self._flush_wanted.wait()
            await asyncio.sleep(FLUSH_INTERVAL_S)  # one pipeline for several batches
            self._flush_wanted.clear()
            batch, self._pending = self._pending, []
            await self._xadd(batch, "run")

    async def _xadd(self, batch: list[BatchSample], src: str) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for s in batch:
                pipe.xadd(self.keys.samples, samples.encode(s, src),  # type: ignore[arg-type,unused-ignore]
                          maxlen=samples.MAXLEN, approximate=True)
            await pipe.execute()


async def serve(args: argparse.Namespace) -> None:
    backend = make_backend(
        args.backend, model=args.model, gpu=args.gpu, seed=args.seed, noise_cv=args.noise_cv,
        block_size=args.block_size, num_blocks=args.num_blocks, time_scale=args.time_scale,
        weights=args.weights, dtype=args.dtype,
    )
    redis = aioredis.Redis.from_url(args.redis_url)
    svc = ExecutorService(backend, redis, Keys(args.prefix))
    server, _ = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["executor"],
        lambda s: executor_grpc.add_ExecutorServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    await svc.publish_warmup()
    flusher = asyncio.create_task(svc.flush_forever())
    svc.log.info("serving", port=args.port, backend=args.backend, model=args.model)
    await rpc.serve_until_signal(server, [flusher])
    await redis.aclose()


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("executor")
    p.add_argument("--backend", default="sim", choices=BACKENDS)
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--gpu", default="a100")
    p.add_argument("--weights", default=None,
                   help="torch: local safetensors/gguf directory; vllm: a Hugging Face directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise-cv", type=float, default=0.03)
    p.add_argument("--block-size", type=int, default=None,
                   help="KV block size (default 16; vllm: vLLM's, 32 on CPU)")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=1.0, help="sim: multiply batch times")
    p.add_argument("--dtype", default=None,
                   help="torch/vllm: weights and activations (default: the backend's; on CPUs "
                        "without bf16 instructions float32 prefills several times faster)")
    return p


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
