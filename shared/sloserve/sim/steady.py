"""Steady state: iterations whose plan the policy declared, run without asking it again.

A policy's ``steady_decodes()`` (``policies.base``) promises its plan while nothing
waits and every running request decodes: every running decode, one token each, in
running order. Between two events that reach an instance (a request dispatched to
it, a request's last token, KV short of a block) its iterations then differ only in
their contexts (+1 each), and its state reports to the controller do not change (no
waiting prefill, a ticket offered). A ``SteadyRun`` runs those iterations: per
iteration the simulator still draws the ground-truth time (``decode_batch_times``:
the same time and noise draw, in the same global order), queues the perf-model sample
(its shape built only if it is ever applied) and adds the KV utilisation, but builds no
plan, item, shape or token event; its end goes through the event heap only when another
event may come first (``Simulation._finish_steady``). The requests'
progress, token times and KV blocks are written back by ``settle`` before anything
else looks at the instance. Decisions, timings and every summary field are those of
asking the policy each iteration (tests/sim/test_steady.py).
"""

from __future__ import annotations

from collections.abc import Callable

from sloserve.batch import BatchPlan, BatchShape, ScheduledItem
from sloserve.instance import Instance
from sloserve.request import Request

# decodes -> (context sum -> measured batch time): ``ProfileTiming.decode_batch_times``
DecodeTimes = Callable[[int], Callable[[int], float]]


class SteadyRun:
    """One instance's steady iterations since ``begin``: ``started`` of them began,
    ``len(ends)`` ended (one more is in flight until ``settle``); ``done`` of them are
    written back into the requests and ``allocated`` into the KV blocks."""

    __slots__ = ("inst", "reqs", "contexts", "n", "context_sum", "last", "counts", "bs",
                 "num_blocks", "free", "started", "ends", "start", "batch_time", "done",
                 "allocated", "stop")

    def __init__(self, inst: Instance, reqs: list[Request], last: int,
                 decode_times: DecodeTimes) -> None:
        kv = inst.kv
        self.inst, self.reqs = inst, reqs
        self.contexts = tuple([r.num_computed for r in reqs])  # KV tokens at the first one
        self.n, self.context_sum = len(reqs), sum(self.contexts)
        self.batch_time = decode_times(self.n)  # context sum -> an iteration's time
        self.last = last  # the first iteration in which a request ends: the run's last
        self.bs, self.num_blocks, self.free = kv.block_size, kv.num_blocks, kv.num_free_blocks
        counts = [0] * self.bs  # decodes per context residue: iteration j+1 needs counts[-j % bs]
        for c in self.contexts:
            counts[c % self.bs] += 1
        self.counts = counts
        self.started = self.done = self.allocated = 0
        self.ends: list[float] = []
        self.start = 0.0
        self.stop = False  # no iteration after the one in flight (a request was dispatched)

    @classmethod
    def begin(cls, inst: Instance, limit: int, now: float,
              decode_times: DecodeTimes) -> tuple[SteadyRun, float] | None:
        """A run whose first iteration starts at ``now`` (and its end), if ``inst`` is in
        its policy's steady state with at most ``limit`` decodes; else None."""
        running = inst.running
        if inst.waiting or not running or len(running) > limit:
            return None
        last = 1 << 62
        # every one decoding (not in_prefill); the first to end, when. From the latest
        # admitted: one still in its prefill (the usual refusal) is most likely that one
        for r in reversed(running):
            g = r.num_generated
            if g == 0 or r.prompt_len + g - r.num_computed > 1:
                return None
            if r.output_len - g < last:
                last = r.output_len - g
        run = cls(inst, list(running), last, decode_times)
        end = run.next_end(now)
        return None if end is None else (run, end)

    def next_end(self, now: float) -> float | None:
        """Start the next iteration at ``now`` if it is steady (no request ended before it,
        nothing was dispatched, KV has its blocks): its end; else None, nothing starts."""
        j = self.started
        if j >= self.last or self.stop:
            return None
        need = self.counts[-j % self.bs]  # contexts c + j at a block boundary
        if need > self.free:
            return None
        self.free -= need
        self.started = j + 1
        self.start = now
        return now + self.batch_time(self.context_sum + self.n * j)

    def write_back(self) -> None:
        """Write the run into the instance as the iterations would have, one by one: the
        KV blocks of every started iteration (in ``Instance.schedule``'s order), the
        progress and token times of every ended one. The one in flight stays in flight."""
        bs, lo, hi = self.bs, self.allocated, self.started
        if hi > lo:  # iteration a+1 (contexts c + a) takes a block where c + a = 0 mod bs
            grow = sorted([(a, i) for i, c in enumerate(self.contexts)
                           for a in range(lo + (-c - lo) % bs, hi, bs)])
            if grow:
                reqs = self.reqs
                self.inst.kv.grow_each([reqs[i].request_id for _, i in grow])
            self.allocated = hi
        assert self.inst.kv.num_free_blocks == self.free, "steady run: KV accounting diverged"
        m, done = len(self.ends), self.done
        if m > done:
            ends = self.ends[done:]
            for r, c in zip(self.reqs, self.contexts):
                r.num_computed = c + m
                r.num_generated += m - done
                r.token_times.extend(ends)
            self.done = m

    def shape_of(self, offset: int) -> BatchShape:
        """The batch shape of the iteration whose contexts are ``offset`` past the first's."""
        return BatchShape((), tuple([c + offset for c in self.contexts]))

    def settle(self) -> tuple[BatchPlan, BatchShape] | None:
        """``write_back``, the run over: the plan and shape still in flight (the last
        started iteration, if it has not ended), else None."""
        self.write_back()
        m = len(self.ends)
        if self.started == m:
            return None
        items = [ScheduledItem(r.request_id, 1, c + m, False)
                 for r, c in zip(self.reqs, self.contexts)]
        return BatchPlan(items), self.shape_of(m)
