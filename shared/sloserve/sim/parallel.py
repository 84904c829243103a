"""``--workers N``: a run's instances in N groups, simulated in N processes, merged.

Only where ``sim.split`` shows that no instance depends on another (else
``SimConfig.validate`` refuses). Part ``g`` simulates the instances whose index is
``g`` mod N (``Simulation(cfg, part=(g, N))``): it builds the whole workload, routes
every arrival through the same round-robin ``Controller`` and keeps those placed on
its instances. The merge is exact: counts and integer totals add; the streaming
summary's sketches merge bucket-wise (``QuantileSketch.merge``: the sketch of all
values); exact mode gathers every request back into workload order and summarises
them as one process does. Float sums (the KV-utilisation sum, sketch running sums,
hence means) add in another order and may differ from one process in the last ulps.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from sloserve.metrics import RunSummary
from sloserve.request import Request
from sloserve.sim.config import SimConfig
from sloserve.sim.report import RunTotals, run_summary
from sloserve.sim.simulator import Simulation


@dataclass(slots=True)
class PartResult:
    """One part's run: its totals, its measurements, and what the process used."""

    totals: RunTotals
    stream: RunSummary | None  # streaming metrics
    requests: list[tuple[int, Request]]  # exact mode: (workload index, request), its own
    num_requests: int  # in the whole workload
    too_long: int
    cpu_s: float
    peak_rss_mb: float


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_part(cfg: SimConfig, group: int) -> PartResult:
    """Simulate part ``group`` of ``cfg.workers`` (in a worker process)."""
    cpu0 = time.process_time()
    sim = Simulation(cfg, part=(group, cfg.workers))
    num_requests = len(sim.workload.requests)
    end = sim.run_events()
    totals = sim.totals(end)
    stream, requests = None, []
    if sim.stream is not None:
        measured = sim.measured()
        assert isinstance(measured, RunSummary)
        stream = measured
    else:
        own = sim.requests
        requests = [(i, r) for i, r in enumerate(sim.workload.requests) if r.request_id in own]
    return PartResult(totals, stream, requests, num_requests, sim.workload.num_too_long,
                      round(time.process_time() - cpu0, 2), _peak_rss_mb())


def simulate_parallel(cfg: SimConfig) -> dict[str, Any]:
    """``simulate(cfg)`` in ``cfg.workers`` processes (forked), merged."""
    cfg.validate()
    wall0 = time.perf_counter()
    n = cfg.workers
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(pool.map(run_part, [cfg] * n, range(n)))
    totals = parts[0].totals
    for p in parts[1:]:
        totals.merge(p.totals)
    measured: RunSummary | list[Request]
    if cfg.metrics == "stream":
        acc = parts[0].stream
        assert acc is not None
        for p in parts[1:]:
            assert p.stream is not None
            acc.merge(p.stream)
        measured = acc
    else:
        placed = sorted((ir for p in parts for ir in p.requests), key=lambda ir: ir[0])
        if [i for i, _ in placed] != list(range(parts[0].num_requests)):
            raise RuntimeError("--workers: the parts' requests do not cover the workload once")
        measured = [r for _, r in placed]
    out = run_summary(cfg, measured, totals, parts[0].too_long, time.perf_counter() - wall0)
    out.update(workers=n, worker_cpu_s=[p.cpu_s for p in parts],
               worker_peak_rss_mb=[p.peak_rss_mb for p in parts],
               driver_peak_rss_mb=_peak_rss_mb())
    return out
