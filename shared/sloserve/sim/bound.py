"""An upper bound on goodput capacity that no scheduler, online or offline, can beat.

The oracle knows every request's arrival, prompt and output length. Whatever
it does, each request it serves well costs the GPU at least a *work floor*:
the terms of the ground-truth batch time (``ProfileTiming``) that the request
adds to any batch it is in, at their cheapest —

* linear layers: ``(prompt + output) x min_N linear(N)/N`` (the most efficient
  batch size, N up to ``max_tokens``),
* prefill attention: ``p(p+1)/2`` query-key pairs at the cheaper of the causal
  and cached-context pair times (chunking can only move pairs between them;
  padding to 128-row tiles and low occupancy only add),
* decode attention: each of its ``output - 1`` decodes reads its KV context
  (plus one page) at the decode bandwidth,
* its per-sequence overhead once per token it is in a batch for;

iteration overhead, the LM head and all-reduce are left out (shared, >= 0).
A request is *infeasible* if its floor-priced prefill alone exceeds its TTFT
SLO or one floor-priced decode exceeds its TBT SLO. Serving a set G of at
least ``target x N`` feasible requests well at rate ``lam`` means (work
conservation, noise of mean 1):

* every request of G ends by ``a + ttft + (output - 1) x tbt`` (its TTFT, then a
  mean TBT within its SLO), so all of G's work fits on the GPUs between the first
  arrival and the latest such end in G;
* every prompt of G is prefilled by ``a + ttft``, so G's prefill work fits between
  the first arrival and the latest such deadline in G.

Arrivals scale as ``1 / lam`` (the generators draw gaps of mean ``1 / qps``), and
for a fixed G each condition's work is fixed and its window only shrinks as ``lam``
grows, so each holds up to some rate and not above; the highest ``lam`` at which
*some* G meets it is found by bisection (a sweep over G's latest end, the cheapest
requests first). (Charging also the decodes due before the TTFT window closes
would be tighter, but which ones are due then depends on ``lam`` both ways, and the
search would no longer be exact.) The capacity is the lower of the two, and 0 if
fewer than ``target x N`` requests are feasible. ``capacity_long_run_qps`` beside it is
what a steady stream can sustain (``long_run_capacity``). It is a relaxation: it ignores
queueing, burstiness within the run, KV capacity and the TBT constraint on
batching, so it is an *upper bound*, not an achievable schedule
(docs/lab/beyond.md). The first version charged the work against the arrivals'
span ``N / lam`` alone; a finite run keeps serving after its last arrival, and
on 400-request runs policies beat that figure by up to 19 %.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sloserve.perf.ground_truth import SEQUENCE_OVERHEAD, ProfileTiming
from sloserve.request import Request


def linear_floor(timing: ProfileTiming, max_tokens: int) -> float:
    """``min_N linear(N) / N`` over ``1 <= N <= max_tokens``, seconds per token."""
    return min(timing.linear_time(n) / n for n in range(1, max_tokens + 1))


def work_floor(req: Request, timing: ProfileTiming, per_token: float) -> tuple[float, float, float]:
    """(total work, prefill-only work, one decode's work) floors of ``req``, seconds."""
    p, o = req.prompt_len, req.output_len
    pair = min(timing._pair_time, timing._ctx_pair_time or timing._pair_time)  # noqa: SLF001
    ctx = timing._ctx_time  # noqa: SLF001
    page = timing._page  # noqa: SLF001
    prefill = p * per_token + p * (p + 1) / 2 * pair + SEQUENCE_OVERHEAD
    d = o - 1
    # decode k (k = 0..d-1) reads p + k + 1 + page tokens of KV
    decode_reads = d * (p + 1 + page) + d * (d - 1) / 2
    total = prefill + d * (per_token + SEQUENCE_OVERHEAD) + decode_reads * ctx
    one_decode = per_token + SEQUENCE_OVERHEAD + (p + 1 + page) * ctx
    return total, prefill, one_decode


def goodput_bound(
    requests: Sequence[Request], timing: ProfileTiming, *, qps: float, instances: int = 1,
    target: float = 0.9, max_tokens: int = 8192,
) -> dict[str, Any]:
    """The bound above for ``requests`` (their SLOs set) whose arrival times were drawn at
    ``qps`` requests/s (the whole deployment's rate): capacity in req/s and its parts."""
    if not requests:
        raise ValueError("requests: need at least one")
    if instances < 1:
        raise ValueError(f"instances: must be >= 1, got {instances}")
    if not 0 < target <= 1:
        raise ValueError(f"target: must be in (0, 1], got {target}")
    if not (qps > 0 and math.isfinite(qps)):
        raise ValueError(f"qps: must be a positive rate, got {qps}")
    per_token = linear_floor(timing, max_tokens)
    first = min(r.arrival_time for r in requests)
    rows: list[tuple[float, float, float, float, float]] = []  # unit arrival, 2 windows, 2 works
    for r in requests:
        total, prefill, one = work_floor(r, timing, per_token)
        if r.slo.ttft is not None and prefill > r.slo.ttft:
            continue
        if r.slo.tbt is not None and r.output_len > 1 and one > r.slo.tbt:
            continue
        ttft = math.inf if r.slo.ttft is None else r.slo.ttft
        last = ttft + (0.0 if r.output_len <= 1 else
                       math.inf if r.slo.tbt is None else (r.output_len - 1) * r.slo.tbt)
        rows.append(((r.arrival_time - first) * qps, ttft, last, prefill, total))
    need = math.ceil(target * len(requests))
    out: dict[str, Any] = {"requests": len(requests), "feasible": len(rows),
                           "target": target, "instances": instances,
                           "linear_s_per_token": per_token}
    if len(rows) < need:
        out.update(capacity_qps=0.0, mean_work_s=None)
        return out
    unit, first_w, last_w, prefill_w, total_w = (np.array(c) for c in zip(*rows, strict=True))
    spread = bool(unit.max() > 0.0)
    cap_first = _capacity(unit, first_w, prefill_w, need, instances, spread)
    cap_last = _capacity(unit, last_w, total_w, need, instances, spread)
    work = sorted(x[4] for x in rows)[:need]
    out.update(capacity_qps=min(cap_first, cap_last), capacity_by_ttft_qps=cap_first,
               capacity_by_end_qps=cap_last, mean_work_s=sum(work) / need,
               capacity_long_run_qps=long_run_capacity(work, len(requests), instances))
    return out


def long_run_capacity(cheapest: Sequence[float], num_requests: int, instances: int) -> float:
    """What a steady stream of this mix can sustain: at rate ``lam`` the ``cheapest`` work
    floors (of the ``target`` share of ``num_requests``) arrive at ``lam x sum / N`` GPU-s
    per second, which ``instances`` GPUs must keep up with. A finite run can beat it by
    finishing in the drain after its last arrival (the first version of this module took it
    for the bound and was beaten by 19 %); a rate above it is out of reach for any scheduler
    on a run long enough that the drain does not count."""
    total = sum(cheapest)
    return math.inf if total <= 0 else instances * num_requests / total


def _fits(unit: np.ndarray, window: np.ndarray, work: np.ndarray, need: int,
          instances: int, rate: float) -> bool:
    """Whether some ``need`` requests' ``work`` fits on ``instances`` GPUs between the first
    arrival and the latest of their ends ``unit / rate + window``: a sweep over which
    request ends last, each with the ``need - 1`` cheapest that end no later. For a fixed
    set the work is fixed and its end only comes earlier as the rate grows, so this
    holds up to some rate and not above."""
    end = unit / rate + window
    heap: list[float] = []  # max-heap (negated) of the ``need - 1`` cheapest so far
    total = 0.0  # their sum
    for k in np.argsort(end, kind="stable"):
        w = float(work[k])
        if len(heap) == need - 1 and total + w <= instances * end[k]:
            return True
        if len(heap) < need - 1:
            heapq.heappush(heap, -w)
            total += w
        elif heap and w < -heap[0]:
            total += w + heapq.heapreplace(heap, -w)
    return False


def _capacity(unit: np.ndarray, window: np.ndarray, work: np.ndarray, need: int,
              instances: int, spread: bool) -> float:
    """The highest rate at which ``_fits`` holds (bisection; reported from above, so it
    stays a bound); ``inf`` if it holds even with every arrival at once, and 0 if it does
    not and the arrivals are all at once (no rate spreads them)."""
    def fits(rate: float) -> bool:
        return _fits(unit, window, work, need, instances, rate)

    if fits(math.inf):
        return math.inf
    if not spread:
        return 0.0
    lo, hi = 0.0, 1.0
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return hi
