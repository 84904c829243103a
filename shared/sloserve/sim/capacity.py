"""Capacity: the largest Poisson arrival rate meeting a criterion, by bisection.

Sarathi-Serve §5.1 and BestServe Algorithm 8 search the same way. The
criterion is always named with the number (docs/design.md, Measurements).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sloserve.metrics import check_criterion, meets
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

Probe = dict[str, Any]


def find_capacity(
    cfg: SimConfig,
    criterion: str = "goodput",
    target: float = 0.9,
    *,
    qps_start: float = 1.0,
    qps_max: float | None = None,
    rel_tol: float = 0.05,
    max_probes: int = 14,
    cache: dict[float, dict[str, Any]] | None = None,
    run: Callable[[SimConfig], dict[str, Any]] = simulate,
) -> dict[str, Any]:
    """Bracket the capacity by doubling/halving from ``qps_start``, then bisect.

    ``cache`` (qps -> summary) lets several criteria share probes of one setup.
    Doubling stops at ``qps_max`` (default ``64 * qps_start``): a criterion still
    met there is reported with ``"at_search_limit": true`` — e.g. a per-gap
    criterion that queueing delay only touches through the first token of a
    finite run (see docs/lab/core-results.md).
    """
    check_criterion(criterion, cfg.tbt_slo)
    if not 0 < target <= 1:
        raise ValueError(f"target: must be in (0, 1], got {target}")
    cache = {} if cache is None else cache
    probes: list[Probe] = []

    def ok(qps: float) -> bool:
        qps = round(qps, 4)
        if qps not in cache:
            cache[qps] = run(dataclasses.replace(cfg, qps=qps))
        s = cache[qps]
        good = meets(s, criterion, target, cfg.tbt_slo)
        probes.append({
            "qps": qps,
            "goodput_share": s["goodput_share"],
            "tbt_token_p99": s["tbt_token_p99"],
            "sched_delay_p50": s["sched_delay_p50"],
            "token_criterion_share": s.get("token_criterion_share"),
            "meets": good,
        })
        return good

    qps_max = 64 * qps_start if qps_max is None else qps_max
    lo, hi = 0.0, qps_start
    if ok(hi):
        lo = hi
        while True:
            if lo >= qps_max or len(probes) >= max_probes:
                hi = float("inf")
                break
            hi = min(lo * 2, qps_max)
            if not ok(hi):
                break
            lo = hi
    else:
        while len(probes) < max_probes:
            hi_new = hi / 2
            if ok(hi_new):
                lo = hi_new
                break
            hi = hi_new
    while hi != float("inf") and lo > 0 and (hi - lo) / hi > rel_tol and len(probes) < max_probes:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return {"capacity_qps": round(lo, 4), "criterion": criterion, "target": target,
            "at_search_limit": hi == float("inf"), "probes": probes}
