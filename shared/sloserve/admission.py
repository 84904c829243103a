"""Admission control: bounded queues and SLO-aware shedding, decided before a request queues.

A new arrival placed on an instance is refused at once, with a reason, when

* the instance already has ``max_queued_requests`` requests waiting for their first
  token (vLLM/Dynamo/Ray Serve's bounded queue: ``max_queued_requests``);
* its prompt would take the prefill tokens waiting there past ``max_queued_tokens``;
* ``shed_late`` and the perf model predicts it cannot meet its own TTFT SLO: the time it
  has already waited, plus the queue ahead of it, plus its own prefill, run in
  iterations of the policy's token budget with the running decodes piggybacked
  (stall-free batching, Sarathi-Serve §4), after the batch under way. This is
  Ascendra §6.3's drop taken at the door: a request that would be dropped (or
  missed) later is answered now, when the client can still go elsewhere. Only an SLO
  the request asked for counts: a deployment's default (``SLO.defaulted``) is never a
  reason to refuse it (issue 35: an idle server serves what it can, however slowly).

The prediction assumes first-come-first-served: a policy that reorders (EDF, SJF)
may serve a newcomer earlier, so it errs towards shedding under overload only.
In a deployment with HP instances (Ascendra) the TTFT test is left to the policy:
an LP request about to miss is offloaded to an HP (§5.3) or dropped there (§6.3),
so shedding it at the door would pre-empt the rescue; the queue bounds still hold.
Only first placements are judged: re-runs after an instance was lost, offloads and
requests restored after a restart were already accepted and are never refused.
The simulator and the live scheduler call the same :func:`refusal`.

On a live instance the prediction is scaled by its :class:`Pace`: how long its
iterations really take from one result to the next (the executor's time plus the
scheduler's own and every hop, all of which stretch on a busy host) relative to the
perf model's prediction for them. A shed decision must hold on a busy host too
(issue 36, item 3): the perf model predicts the executor's batch, not the host's
queueing around it. The simulator has no such overhead (its pace is 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sloserve.batch import BatchShape
from sloserve.defaults import RELAXED_TOKEN_BUDGET
from sloserve.instance import Instance
from sloserve.request import Request

MAX_QUEUED_REQUESTS = 1024  # per instance, waiting for their first token
MAX_QUEUED_TOKENS = 1 << 20  # per instance, prefill tokens not yet computed
SHED_PREFIX = "shed:"  # every refusal's reason starts with it (clients may match on it)
# what a shed client is told to wait before trying again (HTTP Retry-After, gRPC's
# grpc-retry-pushback-ms; issue 35): the smallest whole Retry-After, about one TTFT SLO,
# the time the queue that refused it takes to move on
RETRY_AFTER_S = 1
# EWMA weights of the newest iteration's wall / predicted ratio: a slowdown is followed
# at once, a recovery slowly (a busy host's stalls come in bursts; erring slow sheds a
# little more, erring fast admits requests that then miss)
PACE_RISE, PACE_FALL = 0.3, 0.05
MAX_PACE = 100.0


@dataclass(frozen=True, slots=True)
class Admission:
    """The limits one instance enforces on arrivals (0 turns a bound off)."""

    max_queued_requests: int = MAX_QUEUED_REQUESTS
    max_queued_tokens: int = MAX_QUEUED_TOKENS
    shed_late: bool = True

    def __post_init__(self) -> None:
        for name in ("max_queued_requests", "max_queued_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: must be an integer >= 0 (0: no bound), got {value!r}")


@dataclass(slots=True)
class Pace:
    """How much longer an instance's iterations take, result to result on the wall clock,
    than the perf model predicts (an EWMA, never below 1: an optimistic prediction
    admits requests that then miss; issue 36, item 3)."""

    ratio: float = 1.0

    def observe(self, predicted_s: float, wall_s: float) -> None:
        """A batch's result came ``wall_s`` after the previous one (back to back)."""
        if not (predicted_s > 0 and math.isfinite(wall_s) and wall_s >= 0):
            return
        r = min(MAX_PACE, max(1.0, wall_s / predicted_s))
        self.ratio += (PACE_RISE if r > self.ratio else PACE_FALL) * (r - self.ratio)


def for_deployment(limits: Admission, num_hp: int) -> Admission:
    """The limits every instance of a deployment with ``num_hp`` HP instances enforces."""
    return replace(limits, shed_late=False) if num_hp > 0 and limits.shed_late else limits


def queued_prefill(inst: Instance) -> tuple[int, int]:
    """(requests, tokens) waiting for their first token on ``inst``."""
    n = tokens = 0
    for r in inst.waiting:
        n += 1
        tokens += r.num_uncomputed
    for r in inst.running:
        if not r.token_times:
            n += 1
            tokens += r.num_uncomputed
    return n, tokens


def predicted_ttft(inst: Instance, req: Request, now: float, pace: float = 1.0) -> float:
    """When ``req`` would get its first token if it queued on ``inst`` now, from its arrival;
    the iterations ahead take ``pace`` times the perf model's prediction (:class:`Pace`)."""
    _, ahead = queued_prefill(inst)
    work = ahead + req.prompt_len
    budget = getattr(inst.policy.config, "budget", RELAXED_TOKEN_BUDGET)
    decodes = tuple(r.num_computed for r in inst.running if r.token_times)
    chunk = max(1, budget - len(decodes))
    full, last = divmod(work, chunk)
    t = 0.0
    if inst.running:  # the batch under way ends first (counted whole: we do not know its start)
        t += inst.perf_model.predict(BatchShape(((min(chunk, work), 0),), decodes))
    if full:
        t += full * inst.perf_model.predict(BatchShape(((chunk, 0),), decodes))
    if last:
        t += inst.perf_model.predict(BatchShape(((last, 0),), decodes))
    return (now - req.arrival_time) + max(1.0, pace) * t


def refusal(inst: Instance, req: Request, now: float, limits: Admission,
            pace: float = 1.0) -> str | None:
    """Why ``req`` may not queue on ``inst`` now (``None``: admit it)."""
    n, tokens = queued_prefill(inst)
    if limits.max_queued_requests and n >= limits.max_queued_requests:
        return (f"{SHED_PREFIX} {inst.instance_id} has {n} requests queued "
                f"(max_queued_requests {limits.max_queued_requests})")
    if limits.max_queued_tokens and tokens + req.prompt_len > limits.max_queued_tokens:
        return (f"{SHED_PREFIX} {inst.instance_id} has {tokens} prefill tokens queued, "
                f"+{req.prompt_len} exceeds max_queued_tokens {limits.max_queued_tokens}")
    ttft = req.slo.own("ttft")  # a deployment's default is never a reason to shed (issue 35)
    if limits.shed_late and ttft is not None:
        t = predicted_ttft(inst, req, now, pace)
        if t > ttft and math.isfinite(t):
            return (f"{SHED_PREFIX} predicted TTFT {t:.3f}s on {inst.instance_id} exceeds "
                    f"the TTFT SLO {ttft:.3f}s")
    return None
