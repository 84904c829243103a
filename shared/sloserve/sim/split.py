"""When a run may be split across processes (``--workers``): when no instance depends on another.

A run's instances share only what ``Simulation`` holds for all of them:

* **placement**, by the core ``Controller``. With no HP instance (no tickets, no offload
  targets: an offload becomes a drop on its own instance), no prefix router and no
  instance loss (the simulator has none), ``Controller.admit`` reads only its
  round-robin counter, which counts every arrival: arrival ``i`` goes to LP
  ``i mod n`` whatever any instance did. Each part routes every arrival through its own
  copy of the same controller, so the placement is the one-process placement.
* **the ground truth's noise**: with ``noise_streams="run"`` one stream, drawn in
  global batch-start order, so an instance's batch times depend on every other's
  batches. Exact only without noise or with one stream per instance; an overhead
  profile's gaps are one such stream too.
* **the online perf model**, refit from every instance's batches: exact only if no
  policy reads it (``Policy.reads_perf_model``) or it is frozen (``perf_model=
  "roofline"``); ``PartObservations`` turns any other read into an error. Admission
  control predicts from it, so it is refused.
* write-only totals (iterations, KV utilisation, offloads, the streaming summary) and
  records (plans, samples: refused), and the overlap driver (one process only).

Under these conditions a part's events are the one-process run's events on its
instances, in the same order (the batch-end heap breaks ties by push order, kept
among a part's own pushes), and each event changes only its instance and the
write-only totals: every request ends as it does in one process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sloserve.batch import BatchShape
from sloserve.policies.registry import get_spec
from sloserve.sim.deferred import DeferredObservations

if TYPE_CHECKING:
    from sloserve.sim.config import SimConfig

ONE = "; use --workers 1"


def split_refusal(cfg: SimConfig) -> str | None:
    """Why ``cfg`` cannot run with ``cfg.workers`` processes (one line), or None."""
    w = f"--workers {cfg.workers}"
    if cfg.workers > cfg.instances:
        return f"{w}: more processes than instances (--instances {cfg.instances})"
    if cfg.hp_instances:
        return (f"{w}: HP instances (--hp-instances) take arrivals by ticket and offloads, "
                f"which depend on instance state{ONE}")
    if cfg.prefix_routing:
        return f"{w}: --prefix-routing places arrivals by each instance's cached prefixes{ONE}"
    if cfg.admission is not None:
        return f"{w}: --admission refuses arrivals by the shared online perf model{ONE}"
    if cfg.overlap:
        return f"{w}: --overlap runs in one process only{ONE}"
    if cfg.overhead_profile is not None:
        return (f"{w}: --overhead-profile draws every instance's gaps from one stream in "
                f"global batch order{ONE}")
    if cfg.timing is not None:
        return f"{w}: a ground truth given as an object (SimConfig.timing) is not split{ONE}"
    if cfg.noise_cv > 0 and cfg.noise_streams == "run":
        return (f"{w}: with --noise-cv > 0 every batch's noise comes from one stream in "
                f"global batch order; add --noise-streams instance (or --noise-cv 0)")
    if cfg.record_samples or cfg.record_decisions:
        return f"{w}: record_samples/record_decisions keep one run-wide record{ONE}"
    if cfg.perf_model == "online" and any(
            c.reads_perf_model for c in get_spec(cfg.policy).roles.values()):
        return (f"{w}: policy {cfg.policy!r} reads the online perf model, which every "
                f"instance's batches refit{ONE}")
    return None


class PartObservations(DeferredObservations):
    """The perf model as one part of a split run shows it to its policies: predictions of
    a frozen model only; any other read would see this part's batches alone."""

    def predict(self, shape: BatchShape) -> float:
        if not self._eager:
            raise RuntimeError("--workers: a policy asked the online perf model for a "
                               "prediction, which depends on every instance's batches")
        return super().predict(shape)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise RuntimeError(f"--workers: a policy read the perf model's {name!r}, which "
                           f"depends on every instance's batches")
