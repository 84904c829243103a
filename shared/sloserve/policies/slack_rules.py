"""The rules ``slack`` schedules by, as functions of the instance's view (docs/lab/beyond.md,
"Our policy"): the TBT-slack token budget (AccelGen §4.2 Eq. 6's idea, Ascendra §3.3's
slack), whether a prompt can still make its TTFT at that budget, and the two
one-machine rules — Moore-Hodgson (1968) for the most jobs on time and Smith's backward
rule (1956) for the least total completion time subject to deadlines."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from sloserve.batch import BatchShape
from sloserve.policies.base import InstanceView
from sloserve.request import Request
from sloserve.slo import next_token_deadline


def prompt_work(req: Request) -> int:
    """Tokens ``req`` still has to prefill (hook: a prefix cache would subtract its hits)."""
    return req.num_uncomputed


def tbt_limit(view: InstanceView, decodes: list[Request], margin: float) -> float:
    """Seconds the next iteration may take: ``margin`` x the smallest decode TBT slack
    (``inf`` when no decode has a TBT SLO)."""
    slack = math.inf
    for r in decodes:
        deadline = next_token_deadline(r)
        if deadline is not None and deadline - view.now < slack:
            slack = deadline - view.now
    return slack * margin


def most_prefill(view: InstanceView, base: BatchShape, ctx: int, most: int,
                 fits: Callable[[float], bool]) -> int:
    """The most prefill tokens ``N <= most`` whose batch — ``base`` plus one chunk of ``N``
    over ``ctx`` cached tokens — has a predicted time that ``fits`` (binary search; the
    prediction grows with N)."""
    predict = view.perf_model.predict
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(predict(BatchShape(prefills=(*base.prefills, (mid, ctx)),
                                   decodes=base.decodes))):
            lo = mid
        else:
            hi = mid - 1
    return lo


def prefill_allowance(view: InstanceView, decodes: list[Request], limit: float,
                      cap: int, ctx: int) -> int:
    """The most prefill tokens ``N <= cap`` with predict(decodes + chunk N over ``ctx``)
    <= ``limit``."""
    if limit == math.inf:
        return cap
    base = BatchShape(decodes=tuple(r.num_computed for r in decodes))
    return most_prefill(view, base, ctx, cap, lambda t: t <= limit)


def tile_aligned(allowance: int, num_decodes: int, tile: int) -> int:
    """``allowance`` prefill tokens cut so that the iteration's tokens, ``num_decodes`` +
    the prefill, end on a multiple of ``tile`` (Sarathi-Serve §4.3, tile quantization: a
    chunk of 257 tokens can take 32 % longer than one of 256). Never below one tile's worth
    of prefill or ``allowance`` itself, whichever is smaller; ``tile`` 0 leaves it as is."""
    if tile <= 0 or num_decodes + allowance <= tile:
        return allowance
    whole = (num_decodes + allowance) // tile * tile - num_decodes
    return max(whole, min(allowance, tile))


def smith_order(jobs: list[tuple[float, float, Request]], start: float,
                margin: float = 0.0) -> list[Request]:
    """Smith's backward rule (1956) for the least total completion time subject to deadlines
    on one machine. ``jobs``: ``(deadline, cost, request)`` in deadline order, run back to back
    from ``start``. From the end: of the jobs whose deadline the whole remaining sequence
    meets, the longest goes last; if none does (an overloaded set), the one with the latest
    deadline goes last, as EDF would run it. Returns the requests in run order.

    ``margin``: a job may go last only if it meets its deadline with the predicted time
    from ``start`` to its end stretched by ``1 + margin`` (the prediction error grows with
    the work ahead of it); 0 is Smith's rule, and a large margin EDF."""
    end = start + sum(c for _, c, _ in jobs)
    stretch = 1.0 + margin
    ready: list[tuple[float, float, int]] = []  # max-heap on (cost, deadline, position)
    i = len(jobs) - 1
    out: list[Request] = []
    while len(out) < len(jobs):
        while i >= 0 and jobs[i][0] >= start + stretch * (end - start):
            heapq.heappush(ready, (-jobs[i][1], -jobs[i][0], -i))  # ties: the later goes last
            i -= 1
        if ready:
            k = -heapq.heappop(ready)[2]
        else:
            k = i
            i -= 1
        out.append(jobs[k][2])
        end -= jobs[k][1]
    out.reverse()
    return out


def doomed(req: Request, start_by: float, view: InstanceView, limit: float,
           allowance: int, dec: tuple[int, ...]) -> bool:
    """Whether ``req`` can no longer meet its TTFT: its latest start ``start_by`` has
    passed, or its prompt needs more iterations of this budget than it has time left —
    the last one as predicted beside the decodes ``dec``, each earlier one ``limit`` s
    (the policy passes an iteration's predicted time, at most its TBT limit)."""
    if start_by < view.now:
        return True
    deadline = req.ttft_deadline
    if deadline is None or limit == math.inf or allowance < 1:
        return False
    work = prompt_work(req)
    last = view.perf_model.predict(
        BatchShape(prefills=((min(work, allowance), req.num_computed),), decodes=dec))
    return view.now + (math.ceil(work / allowance) - 1) * limit + last > deadline


def first_token_room(view: InstanceView, shape: BatchShape, deadline: float, stretch: float,
                     most: int) -> int | None:
    """Prefill tokens (at most ``most``) an iteration of ``shape`` may still take once it
    completes a prompt due at ``deadline``: a first token comes only when its iteration
    ends, so the iteration with them, predicted and stretched by ``stretch``, must end by
    then. ``None`` where ``shape`` alone is already predicted to end past the deadline (the
    prompt is late anyway; nothing to protect)."""
    now = view.now
    if now + view.perf_model.predict(shape) > deadline:
        return None
    return most_prefill(view, shape, 0, most, lambda t: now + stretch * t <= deadline)


def prefill_cost(view: InstanceView, limit: float, allowance: int) -> Callable[[int], float]:
    """Predicted seconds to prefill ``tokens`` at this iteration's budget: alone on the
    GPU with no TBT limit, else ``limit`` (an iteration's seconds) per ``allowance`` tokens."""
    if limit == math.inf:
        predict = view.perf_model.predict

        def alone(tokens: int) -> float:
            return predict(BatchShape(prefills=((tokens, 0),)))
        return alone
    rate = limit / max(allowance, 1)  # seconds per prompt token at this budget

    def at_rate(tokens: int) -> float:
        return tokens * rate
    return at_rate


def moore_hodgson(jobs: list[tuple[float, float, Request]], start: float
                  ) -> tuple[list[tuple[float, float, Request]], list[Request]]:
    """Moore-Hodgson (1968), the fewest late jobs on one machine: walk ``jobs``
    (``(deadline, cost, request)``, in deadline order) from ``start``; whenever the
    running end passes a deadline, drop the longest walked so far. Returns the kept
    jobs (in order) and the dropped requests."""
    t = start
    kept: list[tuple[float, int]] = []  # max-heap on cost: (-cost, index)
    out: set[int] = set()
    for k, (deadline, c, _) in enumerate(jobs):
        heapq.heappush(kept, (-c, k))
        t += c
        if t > deadline:
            neg, longest = heapq.heappop(kept)
            t += neg
            out.add(longest)
    if not out:
        return jobs, []
    return ([j for k, j in enumerate(jobs) if k not in out],
            [jobs[k][2] for k in sorted(out)])
