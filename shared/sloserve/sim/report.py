"""A run's summary from its parts: what its requests measured and what the run added up.

One process (``Simulation``) or several (``sim.parallel``, each a group of the
instances) build the same summary here, so both report the same fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sloserve.kv_prefix import prefix_report
from sloserve.metrics import RunSummary, summarize
from sloserve.request import Request
from sloserve.sim.config import SimConfig
from sloserve.sketch import DEFAULT_REL_ERR


@dataclass(slots=True)
class RunTotals:
    """What a run adds up besides its requests' measurements (disjoint parts ``merge``)."""

    end: float  # the last event's time
    iterations: int
    offloads: int
    kv_util_sum: float  # KV utilisation summed over iterations
    preemptions: int
    prefix: dict[str, int] = field(default_factory=dict)  # ``kv_prefix.prefix_counts``

    def merge(self, other: RunTotals) -> None:
        """Add another part's totals: sums, the later end; the float sum up to its order."""
        self.end = max(self.end, other.end)
        self.iterations += other.iterations
        self.offloads += other.offloads
        self.kv_util_sum += other.kv_util_sum
        self.preemptions += other.preemptions
        for k, v in other.prefix.items():
            self.prefix[k] = self.prefix.get(k, 0) + v


def run_summary(cfg: SimConfig, measured: RunSummary | Sequence[Request], totals: RunTotals,
                too_long: int, wall: float) -> dict[str, Any]:
    """The metrics JSON object of a run: ``measured`` is the streaming summary
    (``metrics="stream"``) or every request in workload order (exact mode)."""
    kv_util = totals.kv_util_sum / max(1, totals.iterations)
    out: dict[str, Any]
    if isinstance(measured, RunSummary):
        out = dict(measured.result(kv_utilization=kv_util, preemptions=totals.preemptions))
        out.update(metrics="stream", percentile_rel_err=DEFAULT_REL_ERR)
    else:
        out = dict(summarize(measured, kv_utilization=kv_util, preemptions=totals.preemptions))
    out.update(
        policy=cfg.policy,
        instances=cfg.instances,
        hp_instances=cfg.hp_instances,
        model=cfg.model,
        gpu=cfg.gpu if cfg.timing_profile is None else "cpu-profile",
        qps=cfg.qps,
        seed=cfg.seed,
        token_budget=getattr(cfg.resolved_policy_config(), "token_budget", None),
        too_long=too_long,
        iterations=totals.iterations,
        offloads=totals.offloads,
        sim_time_s=totals.end,
        sim_wall_s=round(wall, 3),
    )
    out.update(prefix_report(totals.prefix))
    if cfg.overhead_profile is not None:
        out["overhead_profile"] = cfg.overhead_profile
    if cfg.overlap:
        out["overlap"] = True
    return out
