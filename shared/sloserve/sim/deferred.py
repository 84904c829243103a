"""Online perf-model observations deferred until a policy asks for a prediction.

The simulator feeds every executed batch to the shared ``AscendraRegression``
(its roofline features, a sliding window, a refit every ``refit_every``
samples); about a fifth of an iteration's cost. Sarathi, vLLM and Orca never
ask for a prediction, so the work is wasted on them. This proxy queues the
samples and applies them, in order, before any prediction (and at the end of
the run), so every prediction sees exactly the model it saw before.

While queued, whole refit periods of the oldest samples are dropped once more
than ``window + 2 * refit_every`` wait: the refits they would have caused are
all superseded by a later one whose window (the last ``window`` samples before
it) lies entirely in what is kept, and dropping a multiple of ``refit_every``
keeps later refits at the same points. Model state after a flush is therefore
identical to observing every sample (pinned by tests/sim/test_golden.py).
A steady iteration (``sim.steady``) queues only its first iteration's contexts and
its offset from them; its ``BatchShape`` is built if it is ever applied.

**Refits on the clock** (``refit_interval``, ``simulate --refit-interval``): the live
perf-model service refits every ``--refit-interval`` seconds of wall time when new
samples arrived, not every so many samples. Here the model's own count-based refits are
off, and the simulator calls ``advance(now)`` before every event: at each grid point
``j * refit_interval`` that passed with fresh samples, a refit over the samples observed
before it is queued at that place in the order. A queued refit supersedes every earlier
one, and only the last ``window`` samples before it can reach the final model, so older
samples are dropped then: the same exactness as above (pinned by tests/sim/test_deferred.py).
"""

from __future__ import annotations

import sys
from typing import Any

from sloserve.batch import BatchSample, BatchShape
from sloserve.perf.regression import AscendraRegression

EAGER_ABOVE = 1 << 20  # a refit period this long (a frozen model): observe as it comes
NEVER = 1 << 62  # the model's refit period when the clock decides its refits
# a queued sample: (shape, duration, 0), or a decode-only one as (first contexts, duration, offset)
Pending = tuple[BatchShape | tuple[int, ...], float, int]


class DeferredObservations:
    """``PerfModel`` for the policies; ``observe`` queues, ``predict`` flushes first."""

    def __init__(self, model: AscendraRegression, refit_interval: float | None = None) -> None:
        self.model = model
        self._pending: list[Pending] = []
        self.refit_interval = refit_interval
        if refit_interval is not None:  # the clock refits: the model never does on its own
            model.refit_every = NEVER
        self._eager = refit_interval is None and model.refit_every > EAGER_ABOVE
        self._keep = sys.maxsize if refit_interval is not None else (
            model.window + 2 * model.refit_every)
        self._refits: list[int] = []  # queued refits: before the pending sample at each index
        self._fresh = 0  # samples since the last refit (the live service refits only then)
        self._wake = 0.0  # the next grid point at which a refit may happen

    def advance(self, now: float) -> None:
        """The clock reads ``now`` (before the event at ``now`` observes anything): queue
        the refit of every grid point passed since the last call, if samples came since."""
        if now < self._wake:
            return
        interval = self.refit_interval
        assert interval is not None, "advance: only with refit_interval"
        if self._fresh:
            self._fresh = 0
            pending = self._pending
            cut = len(pending) - self.model.window
            if cut > 0:  # every earlier refit is superseded; this one's window is kept
                del pending[:cut]
                self._refits = [len(pending)]
            else:
                self._refits.append(len(pending))
        self._wake = (int(now / interval) + 1) * interval

    def observe(self, sample: BatchSample) -> None:
        if self._eager:
            self.model.observe(sample)
            return
        if sample.shape.is_empty or not sample.duration > 0.0:
            return  # the model ignores these too: they must not count toward a period
        pending = self._pending
        pending.append((sample.shape, sample.duration, 0))
        self._fresh += 1
        if len(pending) > self._keep:
            del pending[:self.model.refit_every]

    def observe_batch(self, shape: BatchShape, duration: float) -> None:
        """``observe(BatchSample(shape, duration))``, the sample built only when applied."""
        if self._eager:
            self.model.observe(BatchSample(shape, duration))
            return
        if not shape.decodes and not shape.prefills or not duration > 0.0:
            return
        pending = self._pending
        pending.append((shape, duration, 0))
        self._fresh += 1
        if len(pending) > self._keep:
            del pending[:self.model.refit_every]

    def observe_decodes(self, contexts: tuple[int, ...], offset: int, duration: float) -> None:
        """``observe_batch`` of the decode-only batch whose contexts are ``contexts`` (not
        empty), each plus ``offset``; the shape is built only when applied."""
        if self._eager:
            self.model.observe(BatchSample(_decodes(contexts, offset), duration))
            return
        if not duration > 0.0:
            return
        pending = self._pending
        pending.append((contexts, duration, offset))
        self._fresh += 1
        if len(pending) > self._keep:
            del pending[:self.model.refit_every]

    def flush(self) -> None:
        pending, refits = self._pending, self._refits
        self._pending, self._refits = [], []
        start = 0
        for stop in refits:  # the samples up to each queued refit, then the refit
            self._apply(pending[start:stop])
            self.model.refit()
            start = stop
        self._apply(pending[start:] if start else pending)

    def _apply(self, pending: list[Pending]) -> None:
        observe = self.model.observe
        for shape, duration, offset in pending:
            if not isinstance(shape, BatchShape):
                shape = _decodes(shape, offset)
            observe(BatchSample(shape, duration))

    def predict(self, shape: BatchShape) -> float:
        if self._pending or self._refits:
            self.flush()
        return self.model.predict(shape)

    def __getattr__(self, name: str) -> Any:  # anything else a policy reads: the model, current
        if name.startswith("_"):
            raise AttributeError(name)
        self.flush()
        return getattr(self.model, name)


def _decodes(contexts: tuple[int, ...], offset: int) -> BatchShape:
    return BatchShape((), tuple([c + offset for c in contexts]) if offset else contexts)
