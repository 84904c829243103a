"""Gateway service: ``Generate`` (server-streaming tokens), ``Cancel``, ``Info``.

Validates input (INVALID_ARGUMENT naming the field, ``validate``), tokenizes,
fills SLO defaults, stamps the arrival time (docs/design.md: TTFT starts at the
gateway) and streams each token to the client as its scheduler reports it.
Every multi-instance decision (route, ticket, offload, drop, cancel) is the
core ``Controller``'s; this shell carries out its actions: a ``Dispatch``
submits the request to that instance's scheduler, a ``Drop`` ends the stream
with RESOURCE_EXHAUSTED. A client that disconnects or calls ``Cancel`` is
removed from its scheduler, which frees its KV blocks.

After a whole-stack restart (issue 34, item 6; docs/reliability.md, *Restart*) each
scheduler offers the requests it restored from Redis (``SchedulerOutput.restored``); the
gateway adopts them unattached: they run on, their tokens kept, and a client re-attaches
by request id (``Attach``, the SDK's ``attach``, ``GET /v1/completions/{id}``) to get the
rest of its stream. One not re-attached within ``--reattach-grace`` seconds is cancelled
(or, finished, forgotten) with a log line, and ``Attach`` answers the status it ended with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import grpc

from sloserve.admission import RETRY_AFTER_S
from sloserve.controller import Action, Controller, Dispatch, Drop
from sloserve.decisions import action_record
from sloserve.deployment import Deployment
from sloserve.request import Request
from sloserve.routing_prefix import PrefixRouter
from sloserve.services import auth, deployment_flags, metrics, obs, rpc
from sloserve.services.argtypes import number
from sloserve.services.convert import request_of
from sloserve.services.gateway import membership
from sloserve.services.gateway.chat import render
from sloserve.services.gateway.health_watch import HealthWatch
from sloserve.services.gateway.links import SchedulerLink
from sloserve.services.gateway.outputs import StopStrings, Timeline
from sloserve.services.gateway.placement import Placement
from sloserve.services.gateway.stream import Ended, TokenStream
from sloserve.services.gateway.tokenizer import (
    ByteTokenizer,
    Detokenizer,
    ModelTokenizer,
    make_tokenizer,
)
from sloserve.services.gateway.validate import (
    InputLimits,
    InvalidInput,
    Limits,
    check_backends,
    check_request,
    check_slo,
    request_spec,
)
from sloserve.services.malformed import MalformedRequests

if TYPE_CHECKING:
    from sloserve.services.gateway.openai_surface import VllmTools
from sloserve.services.memtrim import trim_when_grown
from sloserve.services.proto import (
    SERVICE_NAMES,
    common_pb2,
    gateway_grpc,
    gateway_pb2,
    scheduler_pb2,
)
from sloserve.services.redisconn import connect
from sloserve.services.registry import (
    DEFAULT_POLL_S,
    Registry,
    Watch,
    announce,
)
from sloserve.services.tls import ServerTLS
from sloserve.tenancy import DEFAULT_BURST_S, KeyLimits, TenantLimiter

REQUEST_ID_METADATA = "x-request-id"  # a caller's request id, echoed in the response metadata
# gRPC's retry pushback (gRFC A6): on a shed or limited answer, when the client may retry
PUSHBACK_METADATA = "grpc-retry-pushback-ms"
ARRIVAL_METADATA = "x-sloserve-arrival-time"  # virtual clock only: the conductor's stamp
INLINE_TOKENIZE_CHARS = 16 << 10  # longer prompts are tokenized in a thread
REATTACH_GRACE_S = 300.0  # a restored request waits this long for its client (Attach)
ENDED_KEPT = 10_000  # statuses of restored requests that ended unattached, for Attach
STALE_S = 5.0  # at start, a registered scheduler not answering for this long: look again


class GatewayError(Exception):
    """A request the gateway refuses or ends: the gRPC status and its message."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.retry_after_s = retry_after_s  # a per-key limit: when to try again

    def trailers(self) -> tuple[tuple[str, str], ...]:
        """gRPC's retry pushback (``grpc-retry-pushback-ms``, gRFC A6): a per-key limit's own
        wait, else ``RETRY_AFTER_S`` for a shed answer (RESOURCE_EXHAUSTED), else none."""
        retry = self.retry_after_s
        if retry is None and self.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            retry = RETRY_AFTER_S
        if retry is None:
            return ()
        return ((PUSHBACK_METADATA, str(max(1, math.ceil(retry * 1000)))),)


@dataclass(slots=True)
class Flight:
    spec: common_pb2.RequestSpec  # generated_token_ids grows as tokens arrive
    req: Request  # what the controller sees
    events: TokenStream  # its tokens as they arrive, until its client takes them
    instance_id: str = ""  # where its tokens come from (the controller's latest Dispatch)
    owner: str = ""  # the API key's id that created it ("" with auth off)
    tenant: str | None = None  # holds a per-key slot (``sloserve.tenancy``) until released
    client_id: str = ""  # the id the client knows it by (spec.request_id is scoped)
    # restored after a restart (``adopt``): the monotonic time it is given up unless a
    # client attaches first (None: a client holds it), the tokens it came with (replayed
    # on Attach), whether those were all of them, and whether it has ended since
    detached_until: float | None = None
    restored: int = 0
    complete: bool = False
    adopted: bool = False
    done: bool = False


def owner_of(scoped: str, auth_on: bool) -> tuple[str, str]:
    """``(owner, client id)`` of a scoped id (:func:`scoped_id`'s inverse; key ids have
    no colon)."""
    if not auth_on or ":" not in scoped:
        return "", scoped
    owner, _, client_id = scoped.partition(":")
    return owner, client_id


def scoped_id(owner: str, request_id: str) -> str:
    """A client's request id in its API key's namespace (issue 33, 6): the id the gateway,
    controller and schedulers know it by, so two keys may use the same id at once and
    neither can see the other's. ``owner`` is a fixed-length key id (or "" with auth off:
    one namespace), so the scoped id is unambiguous."""
    return f"{owner}:{request_id}" if owner else request_id


@dataclass(slots=True)
class Delta:
    """Tokens of one request that leave together (one message to the client): each with
    its id, text, the time the gateway received it and the time its instance produced it
    (``stream.TokenStream``: what was ready at once, at most every stream interval)."""

    index: int  # the first token's (0 = first output token)
    token_ids: list[int]
    texts: list[str]
    times: list[float]
    produced_times: list[float]
    finish_reason: str  # "" while streaming; set on the one with the request's last token
    instance_id: str
    num_offloads: int
    # each token's logprobs (None: none; Sampling.logprobs unset, or restored)
    logprobs: list[common_pb2.TokenLogprobs | None] = field(default_factory=list)

    def add(self, ev: scheduler_pb2.TokenEvent, text: str, t: float) -> None:
        """Token ``ev`` (its ``text``, received at ``t``) joins the delta."""
        self.token_ids.append(ev.token_id)
        self.texts.append(text)
        self.times.append(t)
        self.produced_times.append(ev.time)
        self.logprobs.append(ev.logprobs if ev.HasField("logprobs") else None)


class GatewayService(gateway_grpc.GatewayServicer):
    LINK_ROLE = "gateway"  # its scheduler streams' Hello (a frontend of several: "frontend")

    def __init__(
        self, controller: Placement, statuses: dict[str, scheduler_pb2.SchedulerStatus],
        addresses: dict[str, str], slo_defaults: dict[str, float | None],
        decision_log: IO[str] | None = None, virtual_clock: bool = False,
        inputs: InputLimits | None = None,
    ) -> None:
        self.log = obs.setup_logging("gateway")
        self.virtual_clock = virtual_clock
        self.ctl, self.statuses, self.addresses = controller, statuses, addresses
        self.slo_defaults = slo_defaults
        self.decision_log = decision_log
        first = next(iter(statuses.values())).executor
        self.first = first  # the model every instance serves (tokenizer, chat template)
        self.inputs = inputs or InputLimits()
        self.model = first.model  # the served model name (metrics' model_name, /v1/models)
        self.tokenizer: ByteTokenizer | ModelTokenizer = make_tokenizer(first.tokenizer_json)
        self.eos_ids = frozenset(first.eos_token_ids)  # finish_reason "stop" on one of them
        self.backends = {st.executor.backend for st in statuses.values()}
        self.tools: VllmTools | None = None  # --tool-call-parser: vLLM's tool calling
        self.limits = self._limits()
        self.flights: dict[str, Flight] = {}
        self.stream_interval = 1  # vLLM's stream_interval: tokens per message at most every
        self.output_seqs: dict[str, int] = {}  # instance -> last SchedulerOutput.seq applied
        # instance -> (prefix-cache queries, hits) its scheduler last reported (/metrics)
        self.prefix_cache: dict[str, tuple[int, int]] = {iid: (0, 0) for iid in statuses}
        # instance -> its queues, KV and preemptions as its scheduler last reported (/metrics)
        self.engines = {iid: metrics.EngineState(
            kv_num_blocks=st.executor.kv_capacity_blocks, block_size=st.executor.block_size)
            for iid, st in statuses.items()}
        # prefix-aware routing: requests get a prefix identity, one id per KV block, as
        # the schedulers give them (routing_prefix; None: round-robin)
        self.hash_unit = first.block_size if controller.prefix_router is not None else None
        self.auth_on = False  # API keys configured (``serve``): requests have owners
        self.tenants: TenantLimiter | None = None  # per-key limits (``serve``), None: off
        self.gateway_id = uuid.uuid4().hex[:8]
        self.reattach_grace = REATTACH_GRACE_S
        self.started_at = time.time()  # a restored request that arrived before: an orphan
        self.heard_from: set[str] = set()  # instances that have answered since we started
        # restored requests that ended with no client attached: Attach answers this status
        self.ended: OrderedDict[str, GatewayError] = OrderedDict()
        self.links: dict[str, SchedulerLink] = {}
        self.watches: dict[str, HealthWatch] = {}
        self.tasks: dict[str, list[asyncio.Task[None]]] = {}  # each instance's link + watch
        for iid, addr in addresses.items():
            self._connect(iid, addr)
        metrics.OFFLOADS.labels(self.model)  # exported from the start, at 0
        metrics.PREFIX_CACHE.source = lambda: (self.model, self.prefix_cache)
        metrics.ENGINES.source = lambda: (self.model, self.engines)
        metrics.GATEWAY_RUNNING.labels(self.model).set_function(
            lambda: sum(1 for f in self.flights.values() if f.spec.generated_token_ids))
        metrics.GATEWAY_WAITING.labels(self.model).set_function(
            lambda: sum(1 for f in self.flights.values() if not f.spec.generated_token_ids))

    def _limits(self) -> Limits:
        """The input limits over every member instance (the smallest context wins)."""
        return Limits(
            min(
                min(s.executor.max_context, s.executor.kv_capacity_blocks * s.executor.block_size)
                for s in self.statuses.values()
            ),
            self.tokenizer.vocab_size,
            self.inputs,
        )

    def _connect(self, iid: str, address: str) -> None:
        self.links[iid] = SchedulerLink(
            iid, address, self.gateway_id, self.inflight, self.on_output, self.LINK_ROLE
        )
        self.watches[iid] = HealthWatch(iid, address, self.on_health)

    def start_links(self, iid: str) -> None:
        """Open ``iid``'s scheduler stream and health watch (in the running loop)."""
        self.tasks[iid] = [
            asyncio.create_task(self.links[iid].run()),
            asyncio.create_task(self.watches[iid].run()),
        ]

    # --- membership (the registry in Redis, issue 34 item 2) -------------------------
    def join(self, iid: str, address: str, st: scheduler_pb2.SchedulerStatus) -> None:
        """A scheduler registered (and answered its Status): the controller takes it in."""
        if st.executor.model != self.model:
            self.log.error(
                "instance_refused",
                instance=iid,
                address=address,
                reason=f"serves {st.executor.model!r}, this deployment {self.model!r}",
            )
            return
        self.statuses[iid], self.addresses[iid] = st, address
        self.prefix_cache[iid] = (0, 0)
        self.engines[iid] = metrics.EngineState(
            kv_num_blocks=st.executor.kv_capacity_blocks, block_size=st.executor.block_size
        )
        self.limits = self._limits()
        self.backends = {st.executor.backend for st in self.statuses.values()}
        self._connect(iid, address)
        self.start_links(iid)
        self.ctl.on_instance_joined(iid, st.role, time.time())
        self.log.info(
            "instance_joined",
            instance=iid,
            address=address,
            role=st.role,
            instances=len(self.statuses),
        )

    def leave(self, iid: str, reason: str) -> None:
        """A scheduler left (``deregistered``: a clean stop; ``expired``: no heartbeat):
        the controller's instance-left transition re-runs its requests elsewhere; they are
        cancelled there (a draining scheduler exits once it holds none), and it is
        forgotten."""
        if iid not in self.links:
            return
        now = time.time()
        actions = self.ctl.on_instance_left(iid, now)
        link = self.links.pop(iid)
        for a in actions:
            if isinstance(a, Dispatch):
                link.cancel(a.request_id)
        link.close()  # after the cancels: they go out before the stream ends
        self.watches.pop(iid)
        for t in self.tasks.pop(iid, [])[1:]:  # the health watch; the link ends by itself
            t.cancel()
        for table in (
            self.statuses,
            self.addresses,
            self.prefix_cache,
            self.engines,
            self.output_seqs,
        ):
            table.pop(iid, None)
        if self.statuses:
            self.limits = self._limits()
        self.log.info(
            "instance_left",
            instance=iid,
            reason=reason,
            at=now,
            rerun=sum(isinstance(a, Dispatch) for a in actions),
            dropped=sum(isinstance(a, Drop) for a in actions),
            instances=len(self.statuses),
        )
        self._carry_out(actions, now)

    def is_member(self, instance_id: str) -> bool:
        return instance_id in self.links

    async def follow(self, watch: Watch, timeout: float) -> None:
        """Carry out the registry's joins and leaves for ever (``membership.follow``: the
        router of several frontends runs the same)."""
        await membership.follow(self, watch, timeout)

    # --- carrying out the controller's decisions ---------------------------------
    def _carry_out(self, actions: Iterable[Action], now: float,
                   reasons: dict[str, str] | None = None) -> None:
        """``reasons``: what the scheduler said about requests it dropped (an admission
        refusal names its limit); the controller's reason otherwise."""
        for action in actions:
            if self.decision_log is not None:
                self.decision_log.write(json.dumps(action_record(action)) + "\n")
                self.decision_log.flush()
            f = self.flights.get(action.request_id)
            if f is None:
                continue
            if isinstance(action, Dispatch):
                if action.cause in ("route", "ticket"):
                    f.spec.origin_instance = action.instance_id
                f.instance_id = action.instance_id
                f.spec.dispatch_time = now
                f.spec.num_offloads = f.req.num_offloads
                self.links[action.instance_id].submit(f.spec)
                if action.cause not in ("route", "ticket"):
                    metrics.OFFLOADS.labels(self.model).inc()
                    self.log.info(action.cause, request=action.request_id,
                                  dst=action.instance_id)
            else:
                why = (reasons or {}).get(action.request_id)
                f.events.close(Drop(action.request_id, why) if why else action)
                f.done = True

    def _located(self, request_id: str, instance_id: str) -> Flight | None:
        """The flight, if ``instance_id`` is where the controller put it (else stale news)."""
        f = self.flights.get(request_id)
        return f if f is not None and self.ctl.location.get(request_id) == instance_id else None

    # --- scheduler side --------------------------------------------------------
    def inflight(self, instance_id: str) -> list[common_pb2.RequestSpec]:
        return [self.flights[r].spec for r in self.ctl.requests_on(instance_id)
                if r in self.flights]

    def on_output(self, instance_id: str, out: scheduler_pb2.SchedulerOutput) -> None:
        if instance_id not in self.links:
            return  # it left the deployment; its requests run elsewhere
        got = time.time()  # every token of this message reached the gateway now (less
        # what the scheduler held it for: TokenEvent.held_s)
        now = out.time or got
        self.heard_from.add(instance_id)
        for spec in out.restored:
            self.adopt(instance_id, spec)
        control = []  # first and last tokens: all the Controller reads (on_tokens)
        flights, where = self.flights, self.ctl.location
        for ev in out.tokens:  # per token: kept to dict lookups and appends
            rid = ev.request_id
            f = flights.get(rid)
            if f is None or where.get(rid) != instance_id:
                continue  # stale news (``_located``)
            ids = f.spec.generated_token_ids
            if ev.index != len(ids):
                continue  # a duplicate replayed after a scheduler restart
            ids.append(ev.token_id)
            f.events.push(ev, got - ev.held_s)  # held at the scheduler: when it was due
            if ev.finished:
                f.done = True
                control.append(ev)
            elif ev.index == 0:
                control.append(ev)
        if control:
            self.ctl.on_tokens(control)
        if out.offloaded or out.dropped:
            offloaded = [f.req for r in out.offloaded if (f := self._located(r, instance_id))]
            dropped = [f.req for d in out.dropped
                       if (f := self._located(d.request_id, instance_id))]
            reasons = {d.request_id: d.reason for d in out.dropped if d.reason}
            for r in dropped:  # the scheduler's own words travel with it (to a router too)
                r.drop_reason = reasons.get(r.request_id, r.drop_reason)
            self._carry_out(self.ctl.on_scheduled(instance_id, offloaded, dropped, now), now,
                            reasons)
        if out.HasField("state"):
            s = out.state
            self.ctl.on_instance_state(s.instance_id, s.num_waiting_prefills, now,
                                       offers_ticket=not s.declines_ticket)
            self.prefix_cache[instance_id] = (s.prefix_query_tokens, s.prefix_hit_tokens)
            self.engines[instance_id] = metrics.EngineState(
                s.num_running, s.num_waiting, s.kv_used_blocks, s.kv_num_blocks,
                s.num_preemptions, self.engines[instance_id].block_size)
        self.output_seqs[instance_id] = out.seq  # applied (InstanceInfo.output_seq)

    # --- restored requests (issue 34, item 6) ---------------------------------------
    def adopt(self, instance_id: str, spec: common_pb2.RequestSpec) -> None:
        """A request ``instance_id`` restored after a restart: if it arrived before this
        gateway started (its gateway is gone with the client's stream), kept, unattached,
        until its client re-attaches (``Attach``) or ``reattach_grace`` passes
        (``expire``); else this gateway knows how it went: cancelled there unless placed
        there."""
        rid = spec.request_id
        if rid in self.flights or spec.arrival_time >= self.started_at:
            # this gateway accepted it (only a scheduler restarted): it holds it, re-run
            # elsewhere or sent again by its client, or it has ended; a leftover there.
            # A frontend of several: one it does not hold is another's, whose Hello
            # claims it back
            if self.ctl.location.get(rid) != instance_id and (
                    self.LINK_ROLE == "gateway" or rid in self.flights):
                self.links[instance_id].cancel(rid)
            self.log.info("restored_known", request_id=rid, instance=instance_id,
                          at=self.ctl.location.get(rid))
            return
        owner, client_id = owner_of(rid, self.auth_on)
        f = Flight(spec, request_of(spec, self.hash_unit), TokenStream(self.stream_interval),
                   instance_id=instance_id, owner=owner, client_id=client_id,
                   detached_until=time.monotonic() + self.reattach_grace,
                   restored=len(spec.generated_token_ids), adopted=True)
        f.complete = f.done = f.restored >= spec.max_tokens
        self.flights[rid] = f
        self.ended.pop(rid, None)
        if not f.complete:
            self.ctl.on_restored(rid, instance_id, time.time())
        self.log.info("request_restored", request_id=rid, instance=instance_id,
                      tokens=f.restored, complete=f.complete)

    def expire(self, now: float) -> None:
        """Give up restored requests no client re-attached to in time: cancel the ones
        still running; each gets a log line and the status ``Attach`` will answer."""
        for f in [f for f in self.flights.values()
                  if f.detached_until is not None and f.detached_until <= now]:
            n = len(f.spec.generated_token_ids)
            what = ("finished; its output was not collected" if f.done else
                    f"cancelled after {n} of {f.spec.max_tokens} tokens")
            where = self.release(f, cancel=not f.done)
            self._ended(f.spec.request_id, GatewayError(
                grpc.StatusCode.ABORTED, f"request {f.client_id}: restored after a restart, "
                f"not re-attached within {self.reattach_grace:g} s: {what}"))
            self.log.warning("request_not_reattached", request_id=f.spec.request_id,
                             instance=where, output_tokens=n, finished=f.done)

    def _ended(self, rid: str, status: GatewayError) -> None:
        self.ended[rid] = status
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    async def expire_forever(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            self.expire(time.monotonic())

    def attach(self, owner: str, request_id: str, start_index: int) -> Flight:
        """The restored request ``request_id`` of ``owner``, now attached (raises
        :class:`GatewayError`: unknown, held by another client, ended, bad index)."""
        rid = scoped_id(owner, request_id)
        f = self.flights.get(rid)
        if f is None or f.owner != owner:
            if (ended := self.ended.get(rid)) is not None:
                raise ended
            if len(self.heard_from) < len(self.links):  # restored requests may be on the way
                raise GatewayError(grpc.StatusCode.UNAVAILABLE,
                                   f"request {request_id}: not known yet, instances are still "
                                   "reconnecting; retry")
            raise GatewayError(grpc.StatusCode.NOT_FOUND,
                               f"request_id: {request_id!r} is not in flight on this gateway")
        if f.detached_until is None:
            raise GatewayError(grpc.StatusCode.ALREADY_EXISTS,
                               f"request_id: {request_id!r} has a client attached")
        if not 0 <= start_index <= f.spec.max_tokens:
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"start_index: must be in [0, {f.spec.max_tokens}], "
                               f"got {start_index}")
        f.detached_until = None
        self.log.info("request_reattached", request_id=rid, start_index=start_index,
                      tokens=len(f.spec.generated_token_ids))
        return f

    async def attach_any(self, owner: str, request_id: str, start_index: int) -> Flight:
        """``attach``; a frontend of several also takes the request over from the frontend
        that adopted it (``FrontendService``)."""
        return self.attach(owner, request_id, start_index)

    def on_health(self, instance_id: str, serving: bool) -> None:
        """An instance turned unhealthy (its executor is dead or hung, or its scheduler
        is unreachable) or healthy again: the controller decides; re-runs are carried
        out and the moved requests cancelled on the lost instance."""
        now = time.time()
        if instance_id not in self.links:
            return  # it left the deployment: no news of it counts
        if serving:
            self.ctl.on_instance_back(instance_id, now)
            self.log.info("instance_back", instance=instance_id, at=now)
            return
        actions = self.ctl.on_instance_lost(instance_id, now)
        self.log.warning("instance_lost", instance=instance_id, at=now,
                         rerun=sum(isinstance(a, Dispatch) for a in actions))
        for a in actions:
            if isinstance(a, Dispatch):
                self.links[instance_id].cancel(a.request_id)
        self._carry_out(actions, now)

    # --- the request path (gRPC ``Generate`` and the OpenAI HTTP API share it) ----------
    async def open(self, request: gateway_pb2.GenerateRequest, now: float,
                   fill_context: bool = False, owner: str = "") -> Flight:
        """Validate, tokenize and admit ``request`` (raises :class:`GatewayError`).
        ``fill_context``: max_tokens is what the context leaves (vLLM's chat default);
        ``owner``: the API key's id that may cancel it ("" with auth off)."""
        try:
            if fill_context:
                request.max_tokens = 1
            check_request(request, self.limits)  # before any work, in time independent of size
            check_backends(request.sampling, self.backends)
            prompt = request.prompt
            if request.messages:
                prompt = self.render_chat(request)
            ids = await self._prompt_ids(request, prompt)
            if fill_context:
                request.max_tokens = max(1, self.limits.max_tokens_total - len(ids))
            spec = request_spec(request, ids, self.limits, self.slo_defaults, now)
        except InvalidInput as exc:
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        client_id = spec.request_id
        spec.request_id = scoped_id(owner, client_id)
        if spec.request_id in self.flights:  # only ever one of the caller's own ids
            raise GatewayError(grpc.StatusCode.ALREADY_EXISTS,
                               f"request_id: {client_id!r} is already in flight")
        tenant = None
        if self.tenants is not None:  # the key's own share first (issue 36, item 7)
            refused = self.tenants.acquire(
                owner, len(spec.prompt_token_ids) + spec.max_tokens, now)
            if refused is not None:
                metrics.DROPS.labels(self.model, "per_key_limit").inc()
                raise GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"request {client_id}: {refused.reason}",
                                   refused.retry_after_s)
            tenant = owner
        f = Flight(spec, request_of(spec, self.hash_unit), TokenStream(self.stream_interval),
                   owner=owner,
                   client_id=client_id, tenant=tenant)
        self.flights[spec.request_id] = f
        action = self.ctl.admit(f.req, now)  # None: the router's answer comes later
        if action is not None:
            self._carry_out([action], now)
        return f

    def render_chat(self, request: gateway_pb2.GenerateRequest) -> str:
        """The prompt of a chat request with the model's template (tools and
        continue_final_message as vLLM renders them; issue 35, item 2)."""
        first = self.first
        tools = json.loads(request.tools_json) if request.tools_json else None
        gen = (request.add_generation_prompt if request.HasField("add_generation_prompt")
               else True)
        return render([(m.role, m.content) for m in request.messages], first.chat_template,
                      first.bos_token, first.eos_token, tools, gen,
                      request.continue_final_message)

    async def tokens(self, f: Flight, start: int = 0) -> AsyncGenerator[Delta, None]:
        """``f``'s tokens from token ``start`` as they arrive, several to a :class:`Delta`
        when several are ready at once (``stream.TokenStream``); a restored request's
        earlier tokens come first, in one Delta (they pass the detokenizer and stop
        strings, as live ones; those before ``start`` the client has: not sent). A drop or
        cancel raises :class:`GatewayError`. Closing the iterator early cancels the
        request everywhere."""
        spec, rid = f.spec, f.client_id
        detok = self.tokenizer.detokenizer()
        stops = StopStrings(spec.sampling.stop)
        timeline = Timeline(self.model, spec.arrival_time, len(spec.prompt_token_ids),
                            spec.max_tokens)
        reason, sched_done, why = "abort", False, ""
        backlog = [scheduler_pb2.TokenEvent(
            request_id=spec.request_id, index=k, token_id=spec.generated_token_ids[k],
            finished=f.complete and k == f.restored - 1) for k in range(f.restored)]
        try:
            while True:
                if backlog:  # a restored request's tokens from before the restart
                    events, times, backlog = backlog, [time.time()] * len(backlog), []
                else:
                    try:
                        events, times = await f.events.take()
                    except Ended as end:
                        if end.why is None:
                            reason = "cancelled"
                            raise GatewayError(grpc.StatusCode.CANCELLED,
                                               f"request {rid}: cancelled") from None
                        reason, sched_done, why = "dropped", True, end.why.reason
                        metrics.DROPS.labels(self.model, metrics.drop_label(why)).inc()
                        raise GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                           f"request {rid}: {why}") from None
                if not stops.stops and events[0].index >= start:  # the common case
                    d: Delta | None = _delta(events, times, detok, f.instance_id,
                                             spec.num_offloads)
                    last = sched_done = events[-1].finished
                    if last:
                        reason = _finish_reason(events[-1], spec, self.eos_ids)
                else:
                    d, last, reason, sched_done = self._group(
                        f, events, times, detok, stops, start, reason)
                if d is not None:
                    if not f.adopted:  # a restored one's TTFT and gaps span the restart
                        # (the Delta's first token: indices run on without a gap)
                        timeline.tokens(d.times, f.instance_id,
                                        events[d.index - events[0].index])
                    d.finish_reason = reason if last else ""
                    yield d
                if last:
                    return
        finally:
            where = self.release(f, cancel=not sched_done)
            st = self.statuses.get(where)
            if f.adopted:
                self.log.info("request_resumed_end", request_id=spec.request_id,
                              instance=where, start_index=start, finish_reason=reason,
                              output_tokens=len(spec.generated_token_ids),
                              **({"drop_reason": why} if why else {}))
            else:
                timeline.finish(self.log, spec, where, st.policy if st else "", reason, why)

    def _group(self, f: Flight, events: list[scheduler_pb2.TokenEvent], times: list[float],
               detok: Detokenizer, stops: StopStrings, start: int, reason: str,
               ) -> tuple[Delta | None, bool, str, bool]:
        """``events`` token by token, through the stop strings, from token ``start`` (the
        client has those before): (their Delta, None when nothing is for the client; the
        stream's last; its finish reason; whether the scheduler finished it)."""
        spec = f.spec
        d = Delta(-1, [], [], [], [], "", f.instance_id, spec.num_offloads)
        last, sched_done = False, False
        for ev, t in zip(events, times):
            sched_done = ev.finished
            text, hit = stops.push(detok.push(ev.token_id), ev.finished)
            last = ev.finished or hit
            if last:
                reason = "stop" if hit else _finish_reason(ev, spec, self.eos_ids)
            if ev.index >= start:  # else the client has it
                if d.index < 0:
                    d.index = ev.index
                d.add(ev, text, t)
            if last:
                break
        return (d if d.index >= 0 else None), last, reason, sched_done

    def release(self, f: Flight, cancel: bool) -> str:
        """Forget ``f``; ``cancel``: its instance still runs it (client gone, cancelled, a
        stop string): free it there. Returns where it was."""
        rid = f.spec.request_id
        instance = self.ctl.location.get(rid)
        self.flights.pop(rid, None)
        if f.tenant is not None and self.tenants is not None:
            self.tenants.release(f.tenant)
            f.tenant = None  # once
        if cancel:
            if instance is not None and instance in self.links:
                self.links[instance].cancel(rid)
            self.ctl.on_cancel(rid, time.time())
        return instance or f.instance_id

    async def Generate(
        self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        now = self._arrival_time(context)
        if not request.request_id:  # a caller's id from the metadata (x-request-id)
            for key, value in context.invocation_metadata() or ():
                if key == REQUEST_ID_METADATA and isinstance(value, str):
                    request.request_id = value
        try:
            f = await self.open(request, now, owner=self._owner(context))
        except GatewayError as exc:
            await _abort(context, exc)
        try:
            await context.send_initial_metadata(((REQUEST_ID_METADATA, f.client_id),))
        except BaseException:  # the client is gone before its first token
            self.release(f, cancel=True)
            raise
        try:
            async with aclosing(self.tokens(f)) as deltas:
                if request.multi_token:
                    async for d in deltas:
                        yield _multi_chunk(f, d)
                else:
                    async for d in deltas:
                        for chunk in _single_chunks(f, d):
                            yield chunk
        except GatewayError as exc:
            await _abort(context, exc)

    async def _prompt_ids(self, request: gateway_pb2.GenerateRequest, prompt: str) -> list[int]:
        """The prompt's token ids; a large text prompt is tokenized off the event loop,
        and only if its byte length allows it to fit the model's limit."""
        if request.prompt_token_ids:
            return list(request.prompt_token_ids)
        n_bytes = len(prompt.encode()) if len(prompt) > INLINE_TOKENIZE_CHARS else len(prompt)
        at_least = -(-n_bytes // self.tokenizer.max_token_bytes)
        if at_least > self.limits.max_tokens_total:
            raise InvalidInput(f"prompt: at least {at_least} tokens, the limit is "
                               f"{self.limits.max_tokens_total}")
        if len(prompt) > INLINE_TOKENIZE_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode, prompt)
        return self.tokenizer.encode(prompt)

    def _owner(self, context: grpc.aio.ServicerContext) -> str:
        """Who is calling: the id of the call's API key; "" with auth off (no identity:
        anyone may cancel anything, as before keys)."""
        if not self.auth_on:
            return ""
        key = auth.bearer(context.invocation_metadata())
        return "" if key is None else auth.key_id(key)

    def _arrival_time(self, context: grpc.aio.ServicerContext) -> float:
        """Now; with a virtual clock, the time the conductor stamped on the call."""
        if self.virtual_clock:
            for key, value in context.invocation_metadata() or ():
                if key == ARRIVAL_METADATA:
                    return float(value)
        return time.time()

    async def Attach(
        self, request: gateway_pb2.AttachRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.GenerateChunk]:
        try:
            f = await self.attach_any(self._owner(context), request.request_id,
                                      request.start_index)
        except GatewayError as exc:
            await _abort(context, exc)
        try:
            async with aclosing(self.tokens(f, request.start_index)) as deltas:
                async for d in deltas:
                    for chunk in _single_chunks(f, d):
                        yield chunk
        except GatewayError as exc:
            await _abort(context, exc)

    async def Cancel(
        self, request: gateway_pb2.CancelRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CancelResponse:
        owner = self._owner(context)
        f = self.flights.get(scoped_id(owner, request.request_id))
        if f is not None and f.owner != owner:
            f = None  # another key's request: as if unknown (no oracle of others' ids)
        if f is not None and f.detached_until is not None:  # restored, no client: end it
            self.release(f, cancel=not f.done)
            self._ended(f.spec.request_id, GatewayError(
                grpc.StatusCode.CANCELLED, f"request {f.client_id}: cancelled"))
            self.log.info("request_cancelled_unattached", request_id=f.spec.request_id,
                          output_tokens=len(f.spec.generated_token_ids))
        elif f is not None:
            f.events.close(None)
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
                connected=self.links[iid].connected,
                ignored_sampling=list(e.ignored_sampling),
                noise_stream=e.noise_stream, noise_cv=e.noise_cv,
                output_seq=self.output_seqs.get(iid, 0)))
        first = self.first
        return gateway_pb2.InfoResponse(
            model=self.model, policies=sorted({i.policy for i in instances}),
            instances=instances, tokenizer=self.tokenizer.name,
            chat_template="model" if first.chat_template else "chatml")


async def _abort(context: grpc.aio.ServicerContext, exc: GatewayError) -> None:
    """End the call with ``exc``; a shed or limited one says when to retry (its trailers)."""
    await context.abort(exc.code, exc.message, exc.trailers())


def _single_chunks(f: Flight, d: Delta) -> list[gateway_pb2.GenerateChunk]:
    """``d`` as one chunk per token (a caller without ``GenerateRequest.multi_token``)."""
    n = len(d.token_ids)
    return [gateway_pb2.GenerateChunk(
        request_id=f.client_id, index=d.index + i, token_id=d.token_ids[i], text=d.texts[i],
        time=d.times[i], arrival_time=f.spec.arrival_time,
        finish_reason=d.finish_reason if i == n - 1 else "", instance_id=d.instance_id,
        num_offloads=d.num_offloads, produced_time=d.produced_times[i],
        logprobs=d.logprobs[i]) for i in range(n)]


def _delta(events: list[scheduler_pb2.TokenEvent], times: list[float], detok: Detokenizer,
           instance_id: str, num_offloads: int) -> Delta:
    """``events`` (received at ``times``) as one :class:`Delta`, built a list at a time (no
    stop strings, none before the client's start: per-token work is a streamed token's
    cost, issue 33, item 3)."""
    push = detok.push
    return Delta(events[0].index, [ev.token_id for ev in events],
                 [push(ev.token_id) for ev in events], times, [ev.time for ev in events], "",
                 instance_id, num_offloads,
                 [ev.logprobs if ev.HasField("logprobs") else None for ev in events])


def _multi_chunk(f: Flight, d: Delta) -> gateway_pb2.GenerateChunk:
    """``d`` as one chunk (a ``GenerateRequest.multi_token`` caller, such as the SDK)."""
    lps = ([lp or common_pb2.TokenLogprobs() for lp in d.logprobs]
           if any(lp is not None for lp in d.logprobs) else [])
    return gateway_pb2.GenerateChunk(
        request_id=f.client_id, index=d.index, token_ids=d.token_ids, texts=d.texts,
        times=d.times, produced_times=d.produced_times, arrival_time=f.spec.arrival_time,
        finish_reason=d.finish_reason, instance_id=d.instance_id, num_offloads=d.num_offloads,
        token_logprobs=lps)


def _finish_reason(ev: scheduler_pb2.TokenEvent, spec: common_pb2.RequestSpec,
                   eos_ids: frozenset[int]) -> str:
    """vLLM's ``check_stop`` order: an EOS (unless ``ignore_eos``) or a stop id is
    ``stop`` even as the last allowed token; else ``length`` when max_tokens was reached,
    ``stop`` before it (issue 35)."""
    s = spec.sampling
    if ev.token_id in s.stop_token_ids or (not s.ignore_eos and ev.token_id in eos_ids):
        return "stop"
    return "length" if ev.index + 1 >= spec.max_tokens else "stop"


_status = membership.scheduler_status


def parse_schedulers(values: list[str]) -> dict[str, str]:
    """``id=host:port`` pairs (roles come from each scheduler's Status); a value may hold
    several, comma-separated (one ConfigMap entry for them all: infra/k8s)."""
    out: dict[str, str] = {}
    for v in [part.strip() for value in values for part in value.split(",")]:
        iid, sep, addr = v.partition("=")
        if not sep or not iid or not addr:
            raise ValueError(f"--scheduler: expected ID=HOST:PORT, got {v!r}")
        out[iid] = addr
    return out


def prefix_router(dep: Deployment,
                  statuses: dict[str, scheduler_pb2.SchedulerStatus]) -> PrefixRouter | None:
    """The simulator's prefix router (``sim.simulator``) for ``--prefix-routing``, over the
    same instances: its units are KV blocks (the live prefix identity is one id per block),
    its memory each instance's KV capacity (the smallest); None: round-robin."""
    if not dep.prefix_routing:
        return None
    blocks = min(s.executor.kv_capacity_blocks for s in statuses.values())
    return PrefixRouter(list(statuses), capacity_units=max(1, blocks))


@dataclass(slots=True)
class Setup:
    """What a gateway (or one frontend of several) reads before it serves: its keys,
    certificate, schedulers and their statuses, Deployment, SLO defaults, input limits."""

    keys: frozenset[str]
    tenants: KeyLimits
    tls: ServerTLS | None
    addresses: dict[str, str]
    statuses: dict[str, scheduler_pb2.SchedulerStatus]
    dep: Deployment
    defaults: dict[str, float | None]
    inputs: InputLimits
    redis: Any  # the registry's (issue 34, item 2); None: a frontend of several
    watch: Watch | None


@dataclass(slots=True)
class Instances:
    """The schedulers known at start (``--scheduler`` + the registry) and how to follow
    the registry from there (``membership.follow``)."""

    addresses: dict[str, str]
    statuses: dict[str, scheduler_pb2.SchedulerStatus]
    redis: Any
    watch: Watch


async def find_instances(args: argparse.Namespace) -> Instances:
    """``--scheduler`` (pinned: never reported by the registry) and the registered ones,
    once ``--min-instances`` are known, each with its Status (the one gateway's start, and
    the router's)."""
    static = parse_schedulers(args.scheduler or [])
    redis = connect(args.redis_url)
    watch = Watch(
        Registry(redis, args.prefix, "scheduler", args.registry_ttl),
        args.registry_poll,
        pinned=frozenset(static),
    )
    deadline = time.monotonic() + args.connect_timeout
    statuses = dict(zip(static, await asyncio.gather(
        *(_status(a, args.connect_timeout) for a in static.values()))))
    while True:
        found = await membership.first_members(watch, len(static), args.min_instances,
                                               max(0.0, deadline - time.monotonic()))
        try:
            statuses.update(zip(found, await asyncio.gather(*(
                _status(a, min(STALE_S, max(0.0, deadline - time.monotonic())))
                for a in found.values()))))
            break
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            # a stale entry (its scheduler crashed and restarts elsewhere): its next
            # heartbeat writes the new address, which the registry is read again for
    return Instances({**static, **found}, statuses, redis, watch)


async def setup(args: argparse.Namespace, find: bool = True) -> Setup:
    """Check the flags and files (bad ones fail before any connection), then find the
    schedulers (``find_instances``; a frontend of several: none, the router lists them)."""
    keys = auth.load_api_keys(args.api_key_file)  # a bad file fails before any connection
    tenants = KeyLimits(args.max_inflight_per_key, args.key_token_rate, args.key_token_burst)
    tls = ServerTLS.from_args(args.tls_cert, args.tls_key)  # so do bad certificate files
    dep = deployment_flags.resolve_into(args)  # the SLOs the schedulers were handed too
    defaults = {"ttft_slo": dep.ttft_slo, "tbt_slo": dep.tbt_slo, "jct_slo": None}
    inputs = InputLimits.from_args(args)
    for name, value in defaults.items():
        if value is not None:
            check_slo(f"--{name.replace('_', '-')}", value, inputs)
    found = await find_instances(args) if find else None
    return Setup(frozenset(keys), tenants, tls, found.addresses if found else {},
                 found.statuses if found else {}, dep, defaults, inputs,
                 found.redis if found else None, found.watch if found else None)


def public_interceptors(keys: frozenset[str]) -> list[grpc.aio.ServerInterceptor]:
    """The public port's: the API-key check (when keys are configured), malformed input."""
    return [*([auth.BearerAuth(keys, "API key")] if keys else []), MalformedRequests()]


def configure(svc: GatewayService, st: Setup, args: argparse.Namespace) -> None:
    """API keys and per-key limits, vLLM's tool parser and the re-attach grace on a built
    service (the one gateway's or a frontend's)."""
    svc.auth_on = bool(st.keys)
    svc.tenants = TenantLimiter(st.tenants) if st.tenants.on else None
    svc.reattach_grace = args.reattach_grace
    svc.stream_interval = args.stream_interval
    if args.tool_call_parser:  # vLLM's parser over the model's tokenizer (issue 35, item 2)
        from sloserve.services.gateway.openai_surface import VllmTools

        first = next(iter(st.statuses.values())).executor
        svc.tools = VllmTools(args.tool_call_parser, first.tokenizer_json)


async def serve(args: argparse.Namespace) -> None:
    st = await setup(args)
    keys, tls, inputs, addresses = st.keys, st.tls, st.inputs, st.addresses
    controller = Controller([(i, s.role) for i, s in st.statuses.items()],
                            prefix_router=prefix_router(st.dep, st.statuses))
    log = open(args.decision_log, "a") if args.decision_log else None
    if args.http_port:  # refuse a taken HTTP port before serving anything
        rpc.check_port_free(args.http_host or args.host, args.http_port)
    svc = GatewayService(controller, st.statuses, addresses, st.defaults, log,
                         args.clock == "virtual", inputs)
    configure(svc, st, args)
    server, _ = await rpc.start_server(
        args.host, args.port, SERVICE_NAMES["gateway"],
        lambda s: gateway_grpc.add_GatewayServicer_to_server(svc, s),
        max_receive_bytes=inputs.max_message_bytes, internal=False, tarpit=False,
        credentials=tls.credentials() if tls else None,
        interceptors=public_interceptors(keys),
    )
    obs.start_metrics(args.metrics_port, args.host)
    for iid in svc.links:
        svc.start_links(iid)
    assert st.watch is not None
    follow = asyncio.create_task(svc.follow(st.watch, args.connect_timeout))
    tasks = [follow]
    beat = await announce(st.redis, args, "gateway", log=svc.log)

    async def leave() -> None:
        """A stopping gateway moves and cancels no request: it stops following the
        registry and closes its scheduler links before the server ends its clients'
        streams, so their requests stay on the schedulers (and in Redis) for the next
        gateway to adopt (issue 34, item 6)."""
        follow.cancel()
        for t in [t for ts in svc.tasks.values() for t in ts]:
            t.cancel()
        await beat.leave()

    tasks.append(asyncio.create_task(svc.expire_forever()))
    # multi-MB requests (poison or not) leave freed buffers in glibc's arenas: give them back
    tasks.append(asyncio.create_task(trim_when_grown(log=svc.log)))
    if keys:
        svc.log.info("api_keys", count=len(keys))
    else:
        svc.log.warning("auth_off", reason=f"no API keys (${auth.API_KEYS_ENV} or "
                        "--api-key-file): every client is served")
    if args.http_port:
        from sloserve.services.gateway.openai_http import build_app, serve_http

        tasks.append(asyncio.create_task(
            serve_http(build_app(svc, keys), args.http_host or args.host, args.http_port,
                       tls=tls)))
    svc.log.info("serving", port=args.port, http_port=args.http_port, instances=list(addresses))
    await rpc.serve_until_signal(server, tasks, before_stop=leave)
    await st.redis.aclose()


AT_LEAST_0, AT_LEAST_0F = number(int, 0, strict=False), number(float, 0, strict=False)
AT_LEAST_1 = number(int, 1, strict=False)


def build_parser() -> argparse.ArgumentParser:
    p = rpc.service_parser("gateway", port=50051)
    p.add_argument("--scheduler", action="append", default=[], metavar="ID=HOST:PORT",
                   help="a fixed instance besides those the registry in Redis lists; "
                        "repeat, or comma-separate: ID=HOST:PORT,ID=HOST:PORT")
    p.add_argument("--min-instances", type=number(int, 1, strict=False), default=1, metavar="N",
                   help="serve once N schedulers are known (--scheduler + registered)")
    p.add_argument("--registry-poll", type=number(float, 0), default=DEFAULT_POLL_S,
                   metavar="SECONDS",
                   help="how often the registry is read for instances joining and leaving")
    deployment_flags.add_deployment_arg(p)
    deployment_flags.add_flags(p, deployment_flags.SLOS, zero_is_none=True)
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--decision-log", default=None,
                   help="append the controller's decisions to this file as JSON lines")
    p.add_argument("--api-key-file", default=None,
                   help=f"API keys, one per line (also ${auth.API_KEYS_ENV}); none: auth off")
    InputLimits.add_flags(p)
    p.add_argument("--max-inflight-per-key", type=AT_LEAST_0,
                   default=0, metavar="N",
                   help="requests one API key may have in flight (0: no bound); over it: "
                        "RESOURCE_EXHAUSTED / HTTP 429 with a retry hint")
    p.add_argument("--key-token-rate", type=AT_LEAST_0F,
                   default=0.0, metavar="TOKENS_PER_S",
                   help="each API key's token bucket rate over prompt + max_tokens (0: off)")
    p.add_argument("--key-token-burst", type=AT_LEAST_0F,
                   default=0.0, metavar="TOKENS",
                   help=f"the bucket's depth (0: {DEFAULT_BURST_S:g} s of the rate)")
    p.add_argument("--reattach-grace", type=number(float, 0, strict=True),
                   default=REATTACH_GRACE_S, metavar="SECONDS",
                   help="after a restart, how long a restored request waits for its client "
                        "to re-attach (Attach) before it is cancelled (issue 34)")
    p.add_argument("--stream-interval", type=AT_LEAST_1, default=1, metavar="N",
                   help="vLLM's stream_interval: after the first token, a stream's tokens "
                        "leave every N tokens (and at its end) in one message (SSE event, or "
                        "gRPC chunk for a multi_token caller such as the SDK); each token "
                        "keeps its own time. 1: every token as it arrives (tokens ready at "
                        "once still share a message)")
    p.add_argument("--http-port", type=int, default=0,
                   help="OpenAI-compatible HTTP API on this port (0: off; `up` uses 8000)")
    p.add_argument("--http-host", default=None, help="default: --host")
    p.add_argument("--tool-call-parser", default="", metavar="NAME",
                   help="vLLM's tool parser for tool_choice auto (as vllm serve's flag; "
                        "SmolLM2: hermes); none: auto is a 400 (default: none)")
    p.add_argument("--tls-cert", default=None,
                   help="serve gRPC and HTTPS with this PEM certificate chain (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="the private key of --tls-cert (PEM)")
    p.add_argument("--clock", choices=("wall", "virtual"), default="wall",
                   help=f"virtual: arrival times come from the {ARRIVAL_METADATA} metadata "
                        "(a protocol test's conductor)")
    return p


def main(argv: list[str] | None = None) -> int:
    return rpc.run_service(serve, build_parser(), argv)
