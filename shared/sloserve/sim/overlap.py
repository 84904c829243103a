"""The simulator with the live scheduler's overlap scheduling (``simulate --overlap``).

The live scheduler (``services/scheduler/overlap.py``, on by default: vLLM's
async scheduling, SGLang's overlap scheduler) decides plan k+1 as soon as plan k
has left for the executor, with plan k applied *provisionally*, and the
executor starts k+1 the moment k ends. Two things follow that the serial
simulator does not have, and both move TTFT and batch composition:

* a request that arrives while batch k runs is first considered for k+2 (plan
  k+1 was decided at k's start), i.e. up to one iteration later;
* a decision sees the state *after* the batch that is still running (its
  finished requests gone, its KV freed, its decodes one token further).

This driver reproduces that timeline with the same core objects: when a batch
starts, the next plan is decided at once (``now`` = the start) and applied to
the ``Instance`` straight away, ending at the time it will end (the simulator
knows the ground truth; the live scheduler uses the predicted end until the
result arrives, then the real one). Its tokens reach the controller when the
batch ends. When a batch ends with no plan decided (the decision at its start
was empty), the next is decided then, as the live loop waits for the result and
decides again. A request that wakes an idle instance is planned at once. With an
overhead profile each back-to-back batch starts after a measured gap
(``sim.overhead``), as in the serial driver.

Not modelled: executor-side early stops (the sim backend has no EOS), and the
live scheduler's provisional token times (predicted end) between a decision and
its result.
"""

from __future__ import annotations

from sloserve.batch import BatchPlan, BatchShape
from sloserve.instance import TokenEvent
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation

Queued = tuple[BatchPlan, BatchShape, float, float, list[TokenEvent]]  # + start, end, tokens


class OverlapSimulation(Simulation):
    """``Simulation`` whose instances decide plan k+1 while plan k runs."""

    def __init__(self, cfg: SimConfig) -> None:
        super().__init__(cfg)
        self.queued: list[Queued | None] = [None] * len(self.instances)
        self.flight_tokens: list[list[TokenEvent]] = [[] for _ in self.instances]

    def _kick(self, k: int, now: float, back_to_back: bool = False) -> None:
        if self.in_flight[k] is not None:
            return  # busy: its successor was decided when it started (or is at its end)
        if self.queued[k] is None and not (
                self.instances[k].has_work and self._plan(k, now, now, back_to_back)):
            return
        q = self.queued[k]
        assert q is not None
        self.queued[k] = None
        plan, shape, start, end, tokens = q
        self.flight_tokens[k] = tokens
        self._start(k, plan, shape, start, end)
        if self.instances[k].has_work:  # plan k+1 leaves while k runs, k applied
            self._plan(k, now, end, True)

    def _plan(self, k: int, now: float, after: float, back_to_back: bool) -> bool:
        """Decide at ``now`` a plan that starts at ``after`` (+ a gap); apply it at once,
        ending when it will end. False for an empty plan."""
        decided = self._decide(k, now)
        if decided is None:
            return False
        plan, shape = decided
        start = after + self._gap(back_to_back)
        end = start + self._batch_time[k](shape)
        self.queued[k] = (plan, shape, start, end,
                          self.instances[k].complete(plan, end, every_token=False))
        return True

    def _apply(self, k: int, plan: BatchPlan, now: float) -> list[TokenEvent]:
        tokens, self.flight_tokens[k] = self.flight_tokens[k], []
        return tokens
