"""Executor service: ``Execute`` (bidi: ``BatchPlan`` in, ``IterationResult`` out), ``Describe``.

Every executed batch (shape + measured time) is appended to the samples
stream for the perf-model service, in the background, off the iteration path.
At startup the backend's profiling sweep is appended first (warm start).
Through a Redis outage samples wait in memory, the newest ``MAX_PENDING`` kept
(the perf model fits a sliding window of the latest batches, so the oldest are
the ones worth least), and are sent when Redis is back.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import redis.asyncio as aioredis

from sloserve.batch import BatchSample
from sloserve.services import deployment_flags, metrics, obs, rpc
from sloserve.services.executor.backends import BACKENDS, Backend, make_backend, plan_shape
from sloserve.services.executor.horizon import Horizon
from sloserve.services.perfmodel import samples
from sloserve.services.proto import SERVICE_NAMES, executor_grpc, executor_pb2
from sloserve.services.redisconn import REDIS_ERRORS, Outage, connect
from sloserve.services.registry import announce
from sloserve.services.store import Keys

FLUSH_INTERVAL_S = 0.1
MAX_PENDING = 4096  # samples held through a Redis outage (the perf model's window)


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


def _skip_stopped(
    plan: executor_pb2.BatchPlan, stopped: set[str]
) -> tuple[executor_pb2.BatchPlan, list[str]]:
    """The plan without items of sequences that stopped in an earlier batch, and their ids.

    With overlap scheduling plan k+1 is decided before plan k's result: a request
    that stopped in k (EOS, a stop id) is still in it. Its ``freed`` (which comes
    once the scheduler has reconciled) ends the skipping."""
    stopped.difference_update(plan.freed)
    if not stopped or not any(i.request_id in stopped for i in plan.items):
        return plan, []
    kept = executor_pb2.BatchPlan()
    kept.CopyFrom(plan)
    del kept.items[:]
    kept.items.extend(i for i in plan.items if i.request_id not in stopped)
    return kept, [i.request_id for i in plan.items if i.request_id in stopped]


class ExecutorService(executor_grpc.ExecutorServicer):
    def __init__(
        self, backend: Backend, redis: aioredis.Redis, keys: Keys,
        horizon: Horizon | None = None,
    ) -> None:
        self.backend = backend
        self.horizon = horizon  # virtual clock: results wait for the conductor's horizon
        self.redis = redis
        self.keys = keys
        self._pending: list[BatchSample] = []
        self._flush_wanted = asyncio.Event()
        self.log = obs.setup_logging("executor")
        self.outage = Outage("samples_flush", self.log)
        self._held: list[tuple[BatchSample, str]] = []  # unsent through a Redis outage
        self.dropped_samples = 0  # oldest samples dropped while Redis was down
        self._model: str | None = None  # metrics label, from describe() on first use

    async def Describe(
        self, request: executor_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ExecutorDescription:
        return self.backend.describe()

    async def Execute(  # type: ignore[override]  # gRPC aio's reader/writer API
        self, request_iterator: AsyncIterator[executor_pb2.BatchPlan],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Plans are read into a queue by a reader task and results written by a writer
        task, so with overlap scheduling (plan k+1 sent while k runs) batch k+1 starts as
        soon as k ends: no stream read or write sits between them (a queue depth of 1+)."""
        self.backend.reset()
        plans: asyncio.Queue[executor_pb2.BatchPlan | None] = asyncio.Queue()
        results: asyncio.Queue[executor_pb2.IterationResult] = asyncio.Queue()

        async def read() -> None:
            try:
                async for plan in request_iterator:
                    plans.put_nowait(plan)
            finally:
                plans.put_nowait(None)

        async def write() -> None:
            while True:
                res = await results.get()
                try:
                    await context.write(res)
                except Exception as exc:  # the stream is gone: the reader sees its end
                    self.log.warning("result_not_sent", iteration=res.iteration, error=repr(exc))
                finally:
                    results.task_done()

        tasks = [asyncio.create_task(read()), asyncio.create_task(write())]
        try:
            await self._run(plans, results)
            await results.join()  # the last results are out before the stream ends
        finally:
            for t in tasks:
                t.cancel()

    async def _run(
        self, plans: asyncio.Queue[executor_pb2.BatchPlan | None],
        results: asyncio.Queue[executor_pb2.IterationResult],
    ) -> None:
        stopped: set[str] = set()  # stopped here (EOS, stop id), not yet freed by the scheduler
        prev_end: float | None = None  # the previous batch's end on this stream
        while (plan := await plans.get()) is not None:
            start = time.perf_counter()
            idle = start - prev_end if prev_end is not None else -1.0
            plan, skipped = _skip_stopped(plan, stopped)
            step = self.backend.execute(plan)
            stopped |= step.stopped
            for seq in plan.added:  # debug: a request's id across the services' logs
                self.log.debug("sequence_added", request_id=seq.request_id,
                               tokens=len(seq.prompt_token_ids) + len(seq.generated_token_ids))
            for rid in step.stopped:
                self.log.debug("sequence_stopped", request_id=rid)
            # the reply is built while the batch runs (sim: before its wait), so only
            # the send is left once the batch is done
            result = executor_pb2.IterationResult(
                iteration=plan.iteration,
                tokens=[
                    executor_pb2.SampledToken(request_id=r, token_id=t,
                                              logprobs=step.logprobs.get(r))
                    for r, t in step.tokens.items()
                ],
                stopped=sorted(step.stopped),
                kv_used_blocks=step.kv_used_blocks,
                idle_before_s=idle, skipped=skipped,
            )
            shape = plan_shape(plan) if plan.items else None
            if step.realtime_wait and self.horizon is not None:  # virtual time
                await self.horizon.wait_for(plan.start_time + step.duration_s)
                measured = step.duration_s
            elif step.realtime_wait:  # sim: really wait the batch's time, minus our own work
                await _wait_until(start + step.duration_s)
                measured = time.perf_counter() - start
            else:
                measured = step.duration_s
            result.duration_s = measured
            prev_end = time.perf_counter()
            results.put_nowait(result)
            if self.horizon is not None or not step.realtime_wait:
                # virtual time: the result is out before the horizon is released (the
                # conductor's order); torch/vllm: before the next batch blocks the loop
                await results.join()
            if self.horizon is not None:
                await self.horizon.released()
            if shape is not None:
                model = self._model_label()
                metrics.ITERATION_TOKENS.labels(model).observe(
                    sum(i.num_tokens for i in plan.items))
                metrics.BATCH_TIME.labels(model).observe(measured)
                self._pending.append(BatchSample(shape, measured))
                self._flush_wanted.set()

    def _model_label(self) -> str:
        """The ``model_name`` label: the model this executor describes itself as."""
        if self._model is None:
            self._model = self.backend.describe().model
        return self._model

    async def publish_warmup(self) -> None:
        sweep = await asyncio.to_thread(self.backend.warmup_samples)
        try:
            await self._xadd([(s, "sweep") for s in sweep])
        except REDIS_ERRORS as exc:  # sent by the flusher once Redis is back
            await self.outage.failed(exc)
            self._hold([(s, "sweep") for s in sweep])
        self.log.info("warmup_samples", count=len(sweep))

    async def flush_forever(self) -> None:
        """Send samples every ``FLUSH_INTERVAL_S``; a Redis error keeps them (bounded)
        and retries with backoff. Never raises a Redis error."""
        while True:
            if not self._held:
                await self._flush_wanted.wait()
            await asyncio.sleep(FLUSH_INTERVAL_S)  # one pipeline for several batches
            self._flush_wanted.clear()
            batch = self._take_held() + [(s, "run") for s in self._pending]
            self._pending = []
            try:
                await self._xadd(batch)
                self.outage.ok()
            except REDIS_ERRORS as exc:
                await self.outage.failed(exc)
                self._hold(batch)
                await asyncio.sleep(self.outage.delay())

    def _hold(self, batch: list[tuple[BatchSample, str]]) -> None:
        """Keep unsent samples, the newest ``MAX_PENDING`` (oldest dropped, counted)."""
        self._held = self._held + batch
        excess = len(self._held) - MAX_PENDING
        if excess > 0:
            self.dropped_samples += excess
            del self._held[:excess]

    def _take_held(self) -> list[tuple[BatchSample, str]]:
        batch, self._held = self._held, []
        return batch

    async def _xadd(self, batch: list[tuple[BatchSample, str]]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for s, src in batch:
                pipe.xadd(self.keys.samples, samples.encode(s, src),  # type: ignore[arg-type,unused-ignore]
                          maxlen=samples.MAXLEN, approximate=True)
            await pipe.execute()


async def serve(args: argparse.Namespace) -> None:
    deployment_flags.resolve_into(args)  # model, GPU, seed, noise, KV: the Deployment's
    # start-up progress: ``up`` reads these events from the log (issue 35)
    obs.setup_logging("executor").info("loading", backend=args.backend, model=args.model)
    backend = make_backend(
        args.backend, model=args.model, gpu=args.gpu, seed=args.seed, noise_cv=args.noise_cv,
        instance=args.instance, block_size=args.block_size, num_blocks=args.num_blocks,
        time_scale=args.time_scale,
        weights=args.weights, fixed_batch_time=args.fixed_batch_time, dtype=args.dtype,
        enforce_eager=args.enforce_eager or None,
    )
    redis = connect(args.redis_url)
    horizon = None
    if args.clock == "virtual":
        horizon = Horizon(redis, Keys(args.prefix), f"{args.host}:{args.port}")
        await horizon.start()
    svc = ExecutorService(backend, redis, Keys(args.prefix), horizon)
    server, _ = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["executor"],
        lambda s: executor_grpc.add_ExecutorServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    svc.log.info("warming_up")
    await svc.publish_warmup()
    flusher = asyncio.create_task(svc.flush_forever())
    svc.log.info("serving", port=args.port, backend=args.backend, model=args.model)
    beat = await announce(redis, args, "executor", log=svc.log)  # the registry (issue 34)
    await rpc.serve_until_signal(server, [flusher], before_stop=beat.leave)
    await redis.aclose()


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("executor")
    p.add_argument("--backend", default="sim", choices=BACKENDS)
    deployment_flags.add_deployment_arg(p)
    deployment_flags.add_flags(p, ("model", "gpu", "seed", "noise_cv", "num_blocks"))
    p.add_argument("--weights", default=None,
                   help="torch: local safetensors/gguf directory; vllm: a Hugging Face directory")
    p.add_argument("--instance", type=int, default=0,
                   help="sim: this executor's index in the stack (lp0 = 0, ...): its noise "
                        "stream is the seed's k-th, as `simulate --noise-streams instance`")
    p.add_argument("--block-size", type=int, default=None,
                   help="KV block size (default 16; vllm: vLLM's, 32 on CPU)")
    p.add_argument("--time-scale", type=float, default=1.0, help="sim: multiply batch times")
    p.add_argument("--fixed-batch-time", type=float, default=None,
                   help="sim: every batch takes this many seconds (protocol tests)")
    p.add_argument("--clock", choices=("wall", "virtual"), default="wall",
                   help="sim, virtual: a batch ends at the plan's start_time + its duration, "
                        "when a conductor moves the horizon there (protocol tests)")
    p.add_argument("--dtype", default=None,
                   help="torch/vllm: weights and activations (default: the backend's; on CPUs "
                        "without bf16 instructions float32 prefills several times faster)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vllm: run the model eagerly (default: compiled, as stock vllm serve; "
                        "eager starts faster, its steps are slower)")
    return p


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
