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
SLO or one floor-priced decode exceeds its TBT SLO. With N requests arriving at
rate ``lam`` per instance, serving a set G well takes ``sum_G work`` GPU-seconds
of the ``N / lam`` that the arrivals span (work conservation, long-run, noise of
mean 1); G must hold ``target x N`` feasible requests, cheapest first. So

    capacity(goodput, target) <= instances x N / (sum of the ceil(target N) smallest floors)

and 0 if fewer than ``target x N`` requests are feasible. It is a relaxation:
it ignores queueing, burstiness, KV capacity and the TBT constraint on batching,
so it is an *upper bound*, not an achievable schedule (docs/beyond.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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
    requests: Sequence[Request], timing: ProfileTiming, *, instances: int = 1,
    target: float = 0.9, max_tokens: int = 8192,
) -> dict[str, Any]:
    """The bound above for ``requests`` (their SLOs set): capacity in req/s and its parts."""
    if not requests:
        raise ValueError("requests: need at least one")
    if instances < 1:
        raise ValueError(f"instances: must be >= 1, got {instances}")
    if not 0 < target <= 1:
        raise ValueError(f"target: must be in (0, 1], got {target}")
    per_token = linear_floor(timing, max_tokens)
    feasible: list[float] = []
    for r in requests:
        total, prefill, one = work_floor(r, timing, per_token)
        if r.slo.ttft is not None and prefill > r.slo.ttft:
            continue
        if r.slo.tbt is not None and r.output_len > 1 and one > r.slo.tbt:
            continue
        feasible.append(total)
    need = math.ceil(target * len(requests))
    out: dict[str, Any] = {"requests": len(requests), "feasible": len(feasible),
                           "target": target, "instances": instances,
                           "linear_s_per_token": per_token}
    if len(feasible) < need:
        out.update(capacity_qps=0.0, mean_work_s=None)
        return out
    work = sorted(feasible)[:need]
    out.update(capacity_qps=instances * len(requests) / sum(work),
               mean_work_s=sum(work) / need)
    return out
