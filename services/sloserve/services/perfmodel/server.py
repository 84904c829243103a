"""Perf-model service: samples stream in, coefficients out (Redis key + pub/sub + gRPC).

Reads every batch the executors append (``XREAD``), keeps the regression's
sliding window, refits every ``--refit-interval`` seconds when new samples
arrived (unset, the Deployment's default: every ``REFIT_EVERY`` samples, as the
simulator), and publishes. ``WatchCoefficients`` streams each new fit.

Through a Redis outage it keeps serving the fit it has (gRPC), retries with
backoff, and when Redis is back reads on from the last sample it saw and
publishes its current fit again (a Redis that came back empty has none).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import redis.asyncio as aioredis

from sloserve.batch import BatchSample
from sloserve.deployment import REFIT_EVERY
from sloserve.services import deployment_flags, metrics, obs, rpc
from sloserve.services.convert import shape_of
from sloserve.services.perfmodel import samples
from sloserve.services.perfmodel.coefficients import Published, regression_for
from sloserve.services.proto import SERVICE_NAMES, perfmodel_grpc, perfmodel_pb2
from sloserve.services.redisconn import REDIS_ERRORS, Outage, connect
from sloserve.services.registry import announce
from sloserve.services.store import Keys

WINDOW = 4096
COUNT_POLL_MS = 1000  # counting batches: how long one read waits for samples


class PerfModelService(perfmodel_grpc.PerfModelServicer):
    def __init__(self, model: str, gpu: str, redis: aioredis.Redis, keys: Keys,
                 refit_interval: float | None = None) -> None:
        self.refit_interval = refit_interval or 0.0  # said in every published fit (0: batches)
        self.reg = regression_for(model, gpu, WINDOW)  # refit on our timer, not per sample
        self.model, self.gpu = model, gpu
        self.redis, self.keys = redis, keys
        self.window: list[BatchSample] = []
        self.current = self._published(0)
        self._watchers: set[asyncio.Queue[Published]] = set()
        self.log = obs.setup_logging("perfmodel")
        self.outage = Outage("samples_reader", self.log)
        self.unpublished = False  # the current fit is not (or may not be) in Redis

    def _published(self, version: int) -> Published:
        mape = self.reg.mape(self.window[-WINDOW:]) if self.window else 0.0
        return Published(list(self.reg.coefficients), version, self.reg.num_samples, time.time(),
                         self.model, self.gpu, mape, self.refit_interval)

    # --- gRPC ---------------------------------------------------------------
    async def GetCoefficients(
        self, request: perfmodel_pb2.CoefficientsRequest, context: grpc.aio.ServicerContext
    ) -> perfmodel_pb2.Coefficients:
        return self.current.to_proto()

    async def WatchCoefficients(
        self, request: perfmodel_pb2.CoefficientsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[perfmodel_pb2.Coefficients]:
        q: asyncio.Queue[Published] = asyncio.Queue()
        self._watchers.add(q)
        try:
            yield self.current.to_proto()
            while True:
                yield (await q.get()).to_proto()
        finally:
            self._watchers.discard(q)

    async def Predict(
        self, request: perfmodel_pb2.PredictRequest, context: grpc.aio.ServicerContext
    ) -> perfmodel_pb2.PredictResponse:
        try:
            shape = shape_of(request.shape)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"shape: {exc}")
        return perfmodel_pb2.PredictResponse(
            duration_s=self.reg.predict(shape), version=self.current.version
        )

    # --- loops ----------------------------------------------------------------
    async def consume(self, refit_interval: float | None) -> None:
        """Read samples and refit for ever; a Redis error pauses it (backoff), never ends it.

        ``refit_interval`` S: a refit every S seconds when samples came; ``None`` (the
        Deployment's default): a fit on the first samples (the executors' warm-up sweep),
        then one every ``REFIT_EVERY`` samples (batches), as the simulator's online model."""
        last_id = "0"
        next_fit = time.monotonic()
        fresh = 0
        while True:
            block_ms = (COUNT_POLL_MS if refit_interval is None
                        else max(1, int((next_fit - time.monotonic()) * 1000)))
            try:
                if self.unpublished:
                    await self._publish()
                reply = await self.redis.xread({self.keys.samples: last_id}, count=5000,
                                               block=block_ms)
                self.outage.ok()
            except REDIS_ERRORS as exc:
                await self.outage.failed(exc)
                self.unpublished = self.current.version > 0
                await asyncio.sleep(self.outage.delay())
                continue
            streams: Any = reply or []
            for _stream, entries in streams:
                for entry_id, fields in entries:
                    last_id = entry_id
                    try:  # anyone who can XADD may write anything: a bad entry is skipped
                        sample = samples.decode(fields)
                        if not (math.isfinite(sample.duration) and sample.duration > 0):
                            raise ValueError(f"t: not a positive duration: {sample.duration}")
                    except (KeyError, ValueError, TypeError) as exc:
                        self.log.warning("sample_malformed", id=str(entry_id),
                                         error=f"{type(exc).__name__}: {exc}"[:200])
                        continue
                    self.reg.observe(sample)
                    self.window.append(sample)
                    fresh += 1
            del self.window[:-WINDOW]
            if refit_interval is None:  # the first samples (the executors' warm-up sweep)
                # fit at once, as the simulator fits its sweep; then every REFIT_EVERY
                if fresh >= REFIT_EVERY or (fresh and self.current.version == 0):
                    fresh = 0
                    await self._refit()
            elif time.monotonic() >= next_fit:
                next_fit = time.monotonic() + refit_interval
                if fresh:
                    fresh = 0
                    await self._refit()

    async def _refit(self) -> None:
        self.reg.refit()
        self.current = self._published(self.current.version + 1)
        metrics.PERF_REFITS.labels(self.model).inc()
        metrics.PERF_FIT_MAPE.labels(self.model).set(self.current.mape)
        for q in self._watchers:
            q.put_nowait(self.current)
        self.log.info("refit", version=self.current.version, samples=self.reg.num_samples,
                      mape=round(self.current.mape, 4), coefficients=self.current.values)
        self.unpublished = True
        try:
            await self._publish()
        except REDIS_ERRORS as exc:  # published by the read loop once Redis is back
            await self.outage.failed(exc)

    async def _publish(self) -> None:
        raw = self.current.to_json()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.coefficients, raw)
            pipe.publish(self.keys.coefficients, raw)
            await pipe.execute()
        self.unpublished = False


async def serve(args: argparse.Namespace) -> None:
    deployment_flags.resolve_into(args)  # model, GPU, refit clock: the Deployment's
    redis = connect(args.redis_url)
    svc = PerfModelService(args.model, args.gpu, redis, Keys(args.prefix), args.refit_interval)
    server, _ = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["perfmodel"],
        lambda s: perfmodel_grpc.add_PerfModelServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    task = asyncio.create_task(svc.consume(args.refit_interval))
    svc.log.info("serving", port=args.port, model=args.model, gpu=args.gpu)
    beat = await announce(redis, args, "perfmodel", log=svc.log)  # the registry (issue 34)
    await rpc.serve_until_signal(server, [task], before_stop=beat.leave)
    await redis.aclose()


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("perfmodel")
    deployment_flags.add_deployment_arg(p)
    deployment_flags.add_flags(p, ("model", "gpu", "refit_interval"))
    return p


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
