"""Ascendra's pluggable value functions for LP out-of-order prefill (§5.2, Algorithm 1).

Algorithm 1 sorts the waiting queue by ``value`` descending; here each
function returns an ascending sort key instead (smallest key runs first),
which ``sorted`` uses directly. Ties keep the queue's own order (stable sort).

* ``edf`` (default): earliest TTFT deadline ``arrival_time + slo.ttft`` first;
  requests without a TTFT SLO go last, FCFS among themselves.
* ``sjf`` / ``ljf``: shortest / longest job first. The job an LP instance
  schedules is the prefill, and prompt length is "a natural predictor of
  execution time" (§3.1) while output length is unknown (§3.2), so the job
  length is the prefill still to compute, ``num_uncomputed`` (the prompt for a
  fresh request; prompt plus generated tokens for one preempted by recompute).
* ``fcfs``: arrival time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sloserve.request import Request

SortKey = tuple[float, float]
ValueFunction = Callable[[Request, float], SortKey]


def edf(req: Request, now: float) -> SortKey:
    deadline = req.ttft_deadline
    return (math.inf if deadline is None else deadline, req.arrival_time)


def sjf(req: Request, now: float) -> SortKey:
    return (req.num_uncomputed, req.arrival_time)


def ljf(req: Request, now: float) -> SortKey:
    return (-req.num_uncomputed, req.arrival_time)


def fcfs(req: Request, now: float) -> SortKey:
    return (req.arrival_time, 0.0)


VALUE_FUNCTIONS: dict[str, ValueFunction] = {"edf": edf, "sjf": sjf, "ljf": ljf, "fcfs": fcfs}


def get_value_function(name: str) -> ValueFunction:
    try:
        return VALUE_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"value_function: must be one of {', '.join(VALUE_FUNCTIONS)}; got {name!r}"
        ) from None
