"""Ascendra's pluggable value functions for LP out-of-order prefill (§5.2, Algorithm 1).

Algorithm 1 computes ``w.val <- pi(Phi, w)`` and sorts by it descending; here
each function returns an ascending sort key instead (smallest key runs first).
A function sees the request and ``prefill_time = Phi(w)``, the regression's
predicted time of the request's remaining prefill run alone.

Time in system. Urgency grows as a request waits (§3.3): its slack is
``deadline - now - Phi(w)``. ``now`` is the same for every waiting request, so
the rank by slack equals the rank by ``deadline - Phi(w)`` (the latest start
time), a key that does not change while the request waits. Every function
here is such a key (time enters only through that common shift), which is
what lets the LP keep its waiting queue in a heap instead of sorting it every
iteration (``ascendra_queue.ValueQueue``); the heap is re-keyed when ``Phi``
is refitted.

* ``edf`` (default): least slack first, i.e. latest start time
  ``arrival_time + slo.ttft - Phi(w)``: depends on the prompt (through
  ``Phi``) and on time in system (through the common ``now``), §3.3; requests
  without a TTFT SLO go last, FCFS among themselves.
* ``priority``: premium before free tier (§8.4: "prioritize premium users over
  free-tier users"): higher ``Request.priority`` first, EDF within a tier.
* ``sjf`` / ``ljf``: shortest / longest job first. The job an LP instance
  schedules is the prefill, and prompt length is "a natural predictor of
  execution time" (§3.1) while output length is unknown (§3.2), so the job
  length is the prefill still to compute, ``num_uncomputed`` (the prompt for a
  fresh request; prompt plus generated tokens for one preempted by recompute).
* ``fcfs``: arrival time (the §8.4 baseline order).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sloserve.request import Request

SortKey = tuple[float, float, float]
ValueFunction = Callable[[Request, float], SortKey]


def latest_start(req: Request, prefill_time: float) -> float:
    """``deadline - Phi(w)``: slack plus ``now``; ``inf`` without a TTFT SLO."""
    deadline = req.ttft_deadline
    return math.inf if deadline is None else deadline - prefill_time


def edf(req: Request, prefill_time: float) -> SortKey:
    return (latest_start(req, prefill_time), req.arrival_time, 0.0)


def priority(req: Request, prefill_time: float) -> SortKey:
    return (-float(req.priority), latest_start(req, prefill_time), req.arrival_time)


def sjf(req: Request, prefill_time: float) -> SortKey:
    return (float(req.num_uncomputed), req.arrival_time, 0.0)


def ljf(req: Request, prefill_time: float) -> SortKey:
    return (-float(req.num_uncomputed), req.arrival_time, 0.0)


def fcfs(req: Request, prefill_time: float) -> SortKey:
    return (req.arrival_time, 0.0, 0.0)


VALUE_FUNCTIONS: dict[str, ValueFunction] = {
    "edf": edf, "priority": priority, "sjf": sjf, "ljf": ljf, "fcfs": fcfs,
}
# orders in which a later request never has less slack than an earlier one of its tier
SLACK_ORDERED = frozenset({"edf"})


def get_value_function(name: str) -> ValueFunction:
    try:
        return VALUE_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"value_function: must be one of {', '.join(VALUE_FUNCTIONS)}; got {name!r}"
        ) from None
