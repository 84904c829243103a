"""sloserve: SLO-aware LLM serving.

The import package ``sloserve`` is the pure core (this directory, ``shared/``):
requests and SLOs, the paged KV block manager, performance models, every
scheduling policy, the multi-instance router, workloads, metrics, the
discrete-event simulator and the BestServe planner. It performs no I/O and has
no clock: callers pass ``now``. Service shells live in ``sloserve.services``.
"""

from __future__ import annotations

__version__ = "0.1.0"
