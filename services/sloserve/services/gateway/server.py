"""Gateway service: ``Generate`` (server-streaming tokens), ``Cancel``, ``Info``.

Validates input (INVALID_ARGUMENT naming the field), tokenizes, fills SLO
defaults, stamps the arrival time (DESIGN.md: TTFT starts at the gateway),
routes with the core ``Router`` (LP round-robin, HP ticket, offloads) and
streams each token to the client as its scheduler reports it. A client that
disconnects or calls ``Cancel`` is removed from its scheduler, which frees
its KV blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from sloserve.defaults import TBT_SLO, TTFT_SLO
from sloserve.request import Request
from sloserve.router import Router
from sloserve.services import obs, rpc
from sloserve.services.convert import request_of
from sloserve.services.gateway.links import SchedulerLink
from sloserve.services.gateway.tokenizer import ByteTokenizer, ModelTokenizer, make_tokenizer
from sloserve.services.proto import (
    SERVICE_NAMES,
    common_pb2,
    gateway_grpc,
    gateway_pb2,
    scheduler_grpc,
    scheduler_pb2,
)

Event = Any  # scheduler_pb2.TokenEvent | scheduler_pb2.Drop | None (None: cancelled)


class InvalidInput(ValueError):
    """Bad client input; the message starts with the field name."""


@dataclass(slots=True)
class Flight:
    spec: common_pb2.RequestSpec  # generated_token_ids grows as tokens arrive
    req: Request  # what the router sees
    instance_id: str
    events: asyncio.Queue[Event]


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens_total: int  # prompt + max_tokens must fit (model context and KV capacity)
    vocab_size: int


class GatewayService(gateway_grpc.GatewayServicer):  # type: ignore[misc]  # generated
    def __init__(
        self, router: Router, statuses: dict[str, scheduler_pb2.SchedulerStatus],
        addresses: dict[str, str], slo_defaults: dict[str, float | None],
    ) -> None:
        self.log = obs.setup_logging("gateway")
        self.router, self.statuses, self.addresses = router, statuses, addresses
        self.slo_defaults = slo_defaults
        first = next(iter(statuses.values())).executor
        self.tokenizer: ByteTokenizer | ModelTokenizer = make_tokenizer(first.tokenizer_json)
        self.limits = Limits(
            min(min(s.executor.max_context, s.executor.kv_capacity_blocks * s.executor.block_size)
                for s in statuses.values()),
            self.tokenizer.vocab_size,
        )
        self.flights: dict[str, Flight] = {}
        self.gateway_id = uuid.uuid4().hex[:8]
        self.links = {
            iid: SchedulerLink(iid, addr, self.gateway_id, self.inflight, self.on_output)
            for iid, addr in addresses.items()
        }

    # --- scheduler side --------------------------------------------------------
    def inflight(self, instance_id: str) -> list[common_pb2.RequestSpec]:
        return [f.spec for f in self.flights.values() if f.instance_id == instance_id]

    def on_output(self, instance_id: str, out: scheduler_pb2.SchedulerOutput) -> None:
        now = time.time()
        for ev in out.tokens:
            f = self.flights.get(ev.request_id)
            if f is None or f.instance_id != instance_id:
                continue
            if ev.index != len(f.spec.generated_token_ids):
                continue  # a duplicate replayed after a scheduler restart
            f.spec.generated_token_ids.append(ev.token_id)
            if ev.index == 0:
                self.router.on_prefill_done(ev.request_id)
            f.events.put_nowait(ev)
        for rid in out.offloaded:
            f = self.flights.get(rid)
            if f is None or f.instance_id != instance_id:
                continue
            try:
                target = self.router.route_offload(f.req, now)
            except ValueError as exc:  # no HP instance to take it
                f.events.put_nowait(scheduler_pb2.Drop(request_id=rid, reason=str(exc)))
                continue
            f.req.num_offloads += 1
            f.spec.num_offloads += 1
            f.instance_id = target
            self.links[target].submit(f.spec)
            self.log.info("offload", request=rid, src=instance_id, dst=f.instance_id)
        for drop in out.dropped:
            f = self.flights.get(drop.request_id)
            if f is not None and f.instance_id == instance_id:
                self.router.on_prefill_done(drop.request_id)
                f.events.put_nowait(drop)
        if out.HasField("state"):
            s = out.state
            self.router.on_instance_state(s.instance_id, s.num_waiting_prefills, now)

    # --- client side ---------------------------------------------------------------
    def _spec(self, r: gateway_pb2.GenerateRequest, now: float) -> common_pb2.RequestSpec:
        if r.prompt and r.prompt_token_ids:
            raise InvalidInput("prompt: give either prompt or prompt_token_ids, not both")
        ids = list(r.prompt_token_ids) if r.prompt_token_ids else self.tokenizer.encode(r.prompt)
        if not ids:
            raise InvalidInput("prompt: must not be empty")
        bad = [t for t in ids if not 0 <= t < self.limits.vocab_size]
        if bad:
            raise InvalidInput(
                f"prompt_token_ids: {bad[:3]} outside the vocabulary [0, {self.limits.vocab_size})")
        if r.max_tokens < 1:
            raise InvalidInput(f"max_tokens: must be >= 1, got {r.max_tokens}")
        if len(ids) + r.max_tokens > self.limits.max_tokens_total:
            raise InvalidInput(
                f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({r.max_tokens}) exceeds "
                f"the limit of {self.limits.max_tokens_total} tokens")
        rid = r.request_id or uuid.uuid4().hex
        if rid in self.flights:
            raise InvalidInput(f"request_id: {rid!r} is already in flight")
        spec = common_pb2.RequestSpec(
            request_id=rid, prompt_token_ids=ids, max_tokens=r.max_tokens,
            priority=r.priority, arrival_time=now)
        _check_sampling(r.sampling, self.limits.vocab_size)
        spec.sampling.CopyFrom(r.sampling)
        for name in ("ttft_slo", "tbt_slo", "jct_slo"):
            value = getattr(r, name) if r.HasField(name) else self.slo_defaults.get(name)
            if value is not None:
                if not (math.isfinite(value) and value > 0):
                    raise InvalidInput(f"{name}: must be a positive number of seconds, got {value}")
                setattr(spec, name, value)
        return spec

    async def Generate(
        self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        now = time.time()
        try:
            spec = self._spec(request, now)
        except InvalidInput as exc:
            code = (grpc.StatusCode.ALREADY_EXISTS if str(exc).startswith("request_id")
                    else grpc.StatusCode.INVALID_ARGUMENT)
            await context.abort(code, str(exc))
        req = request_of(spec)
        rid = spec.request_id
        target = self.router.route(req, now)
        spec.origin_instance = target
        f = Flight(spec, req, target, asyncio.Queue())
        self.flights[rid] = f
        self.links[target].submit(spec)
        detok = self.tokenizer.detokenizer()
        done = False
        try:
            while not done:
                ev = await f.events.get()
                if ev is None:
                    await context.abort(grpc.StatusCode.CANCELLED, f"request {rid}: cancelled")
                if isinstance(ev, scheduler_pb2.Drop):
                    done = True
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        f"request {rid}: {ev.reason}")
                done = ev.finished
                yield gateway_pb2.GenerateChunk(
                    request_id=rid, index=ev.index, token_id=ev.token_id,
                    text=detok.push(ev.token_id), time=time.time(), arrival_time=now,
                    finish_reason=_finish_reason(ev, spec.max_tokens) if done else "",
                    instance_id=f.instance_id, num_offloads=spec.num_offloads,
                    produced_time=ev.time,
                )
        finally:
            self.flights.pop(rid, None)
            if not done:  # client went away or cancelled: free it everywhere
                self.links[f.instance_id].cancel(rid)
                self.router.on_prefill_done(rid)

    async def Cancel(
        self, request: gateway_pb2.CancelRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CancelResponse:
        f = self.flights.get(request.request_id)
        if f is not None:
            f.events.put_nowait(None)
        return gateway_pb2.CancelResponse(found=f is not None)

    async def Info(
        self, request: gateway_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.InfoResponse:
        instances = []
        for iid, st in self.statuses.items():
            e = st.executor
            instances.append(gateway_pb2.InstanceInfo(
                instance_id=iid, role=st.role, policy=st.policy, address=self.addresses[iid],
                model=e.model, hardware=e.hardware, backend=e.backend,
                kv_capacity_blocks=e.kv_capacity_blocks, block_size=e.block_size,
                connected=self.links[iid].connected))
        return gateway_pb2.InfoResponse(
            model=instances[0].model, policies=sorted({i.policy for i in instances}),
            instances=instances, tokenizer=self.tokenizer.name)


def _check_sampling(s: common_pb2.Sampling, vocab_size: int) -> None:
    """vLLM's SamplingParams ranges; the message names the field."""
    if s.HasField("temperature") and not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise InvalidInput(f"sampling.temperature: must be >= 0, got {s.temperature}")
    if s.HasField("top_p") and not 0 < s.top_p <= 1:
        raise InvalidInput(f"sampling.top_p: must be in (0, 1], got {s.top_p}")
    if s.HasField("top_k") and s.top_k < 0:
        raise InvalidInput(f"sampling.top_k: must be >= 0 (0 disables), got {s.top_k}")
    bad = [t for t in s.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidInput(f"sampling.stop_token_ids: {bad[:3]} outside [0, {vocab_size})")


def _finish_reason(ev: Any, max_tokens: int) -> str:
    """OpenAI/vLLM semantics: ``length`` when max_tokens was reached, else ``stop``."""
    return "length" if ev.index + 1 >= max_tokens else "stop"


async def _status(target: str, timeout: float) -> scheduler_pb2.SchedulerStatus:
    stub = scheduler_grpc.SchedulerStub(rpc.channel(target))
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await stub.Status(scheduler_pb2.StatusRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def parse_schedulers(values: list[str]) -> dict[str, str]:
    """``id=host:port`` pairs (roles come from each scheduler's Status)."""
    out: dict[str, str] = {}
    for v in values:
        iid, sep, addr = v.partition("=")
        if not sep or not iid or not addr:
            raise ValueError(f"--scheduler: expected ID=HOST:PORT, got {v!r}")
        out[iid] = addr
    return out


async def serve(args: argparse.Namespace) -> None:
    addresses = parse_schedulers(args.scheduler)
    statuses = dict(zip(addresses, await asyncio.gather(
        *(_status(a, args.connect_timeout) for a in addresses.values()))))
    router = Router([i for i, s in statuses.items() if s.role == "lp"],
                    [i for i, s in statuses.items() if s.role == "hp"])
    defaults = {"ttft_slo": args.ttft_slo or None, "tbt_slo": args.tbt_slo or None,
                "jct_slo": None}
    svc = GatewayService(router, statuses, addresses, defaults)
    server, _ = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["gateway"],
        lambda s: gateway_grpc.add_GatewayServicer_to_server(svc, s),
    )
    obs.start_metrics(args.metrics_port, args.host)
    tasks = [asyncio.create_task(link.run()) for link in svc.links.values()]
    svc.log.info("serving", port=args.port, instances=list(addresses))
    await rpc.serve_until_signal(server, tasks)


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("gateway", port=50051, redis=False)
    p.add_argument("--scheduler", action="append", required=True, metavar="ID=HOST:PORT")
    p.add_argument("--ttft-slo", type=float, default=TTFT_SLO,
                   help="default TTFT SLO, s (0: none)")
    p.add_argument("--tbt-slo", type=float, default=TBT_SLO, help="default TBT SLO, s (0: none)")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    return p


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
