"""The one thing a policy asks of a performance model: a batch's predicted time."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sloserve.batch import BatchSample, BatchShape


@runtime_checkable
class PerfModel(Protocol):
    def predict(self, shape: BatchShape) -> float:
        """Predicted duration of one iteration running ``shape``, in seconds."""
        ...


@runtime_checkable
class OnlinePerfModel(PerfModel, Protocol):
    def observe(self, sample: BatchSample) -> None:
        """Record a measured batch; the model may refit from it."""
        ...


@runtime_checkable
class TimingSource(Protocol):
    """Ground truth for a simulated GPU: the *actual* duration of a batch.

    Schedulers never see this object (docs/design.md, executors: sim).
    """

    def batch_time(self, shape: BatchShape) -> float: ...
