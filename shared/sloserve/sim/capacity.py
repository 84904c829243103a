"""Capacity: the largest Poisson arrival rate meeting a criterion, by bisection.

Sarathi-Serve §5.1 and BestServe Algorithm 8 search the same way. The
criterion is always named with the number (docs/design.md, Measurements), and
judged by ``sloserve.metrics.meets``, the one definition (issue 38). Every probe
reports what was hidden before: the drop share, the trace rows too long for the
model's context, and the rate as asked (``qps``), as offered and as served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sloserve.metrics import MAX_DROP_SHARE, check_criterion, meets
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import simulate

Probe = dict[str, Any]
# each probe's summary fields reported beside its rate and verdict
PROBE_KEYS = ("goodput_share", "tbt_token_p99", "sched_delay_p50", "sched_delay_p50_all",
              "token_criterion_share", "dropped", "drop_share", "too_long", "offered_rps",
              "served_rps")


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
    max_drop_share: float = MAX_DROP_SHARE,
) -> dict[str, Any]:
    """Bracket the capacity by doubling/halving from ``qps_start``, then bisect.

    ``cache`` (qps -> summary) lets several criteria share probes of one setup.
    Doubling stops at ``qps_max`` (default ``64 * qps_start``): a criterion still
    met there is reported with ``"at_search_limit": true`` — e.g. a per-gap
    criterion that queueing delay only touches through the first token of a
    finite run (see docs/lab/core-results.md). ``max_drop_share`` bounds the ``tail``
    criterion's drop share (``--max-drop-share``).
    """
    check_criterion(criterion, cfg.tbt_slo, max_drop_share)
    if not 0 < target <= 1:
        raise ValueError(f"target: must be in (0, 1], got {target}")
    cache = {} if cache is None else cache
    probes: list[Probe] = []

    def ok(qps: float) -> bool:
        qps = round(qps, 4)
        if qps not in cache:
            cache[qps] = run(dataclasses.replace(cfg, qps=qps))
        s = cache[qps]
        good = meets(s, criterion, target, cfg.tbt_slo, max_drop_share)
        probes.append({"qps": qps, **{k: s.get(k) for k in PROBE_KEYS}, "meets": good})
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
    out = {"capacity_qps": round(lo, 4), "criterion": criterion, "target": target,
           "at_search_limit": hi == float("inf"), "probes": probes}
    if criterion == "tail":
        out["max_drop_share"] = max_drop_share
    # the capacity rate as offered (too-long rows removed) and as served, with its drops
    at = cache.get(round(lo, 4)) if lo > 0 else None
    out["at_capacity"] = None if at is None else {
        k: at.get(k) for k in ("offered_rps", "served_rps", "dropped", "drop_share", "too_long")}
    return out
