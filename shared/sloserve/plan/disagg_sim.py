"""Accurate mode for disaggregated (``ypzd``) strategies: a per-iteration P/D simulator.

``sloserve.sim`` has no prefill/decode split, so the accurate counterpart of
BestServe's tandem queue (§3.4.3) lives here. What changes against the fast
simulators (``fast_sim.simulate_disaggregated``) is the decode side: every
decode *iteration* is timed on its real batch -- the running requests' own
contexts, one token each -- instead of a whole request timed at the pseudo
batch size ``b†`` of eq. 9. The cost model is the same ``TimingSource`` as the
collocated accurate mode (a real profile or the BestServe Estimator).

As a vLLM P/D deployment behaves (where the paper is silent):

* a proxy sends each request to prefill instance ``i mod y`` on arrival, and each
  prefilled request to decode instance ``k mod z`` in order of readiness
  (round robin, vLLM's disaggregated-prefill proxy); instances then run
  independently;
* a prefill instance runs FCFS whole-prompt batches of at most ``max_batch``
  requests and ``max_tokens`` prompt tokens (always at least one request);
* a decode instance admits ready requests FCFS while fewer than ``slots`` run
  (``max_num_seqs`` capped by KV capacity, as in the fast mode), then runs one
  token for each running request per iteration;
* the KV cache moves after the prefill at the prefill phase's ``e_+``
  (``fast_sim.kv_transfer_time``), so TTFT excludes it and TPOT includes it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sloserve.batch import BatchShape
from sloserve.perf.base import TimingSource
from sloserve.plan.fast_sim import Latencies, Requests


def _prefill_instance(timing: TimingSource, reqs: Requests, mine: np.ndarray, max_batch: int,
                      max_tokens: int, first: np.ndarray) -> None:
    """FCFS whole-prompt batches on one prefill instance; fills ``first`` for ``mine``."""
    now, i, n = 0.0, 0, len(mine)
    while i < n:
        now = max(now, float(reqs.arrivals[mine[i]]))
        end, tokens = i, 0
        while (end < n and end - i < max_batch and reqs.arrivals[mine[end]] <= now
               and (end == i or tokens + int(reqs.prompt_lens[mine[end]]) <= max_tokens)):
            tokens += int(reqs.prompt_lens[mine[end]])
            end += 1
        batch = mine[i:end]
        now += timing.batch_time(BatchShape(prefills=tuple(
            (int(reqs.prompt_lens[r]), 0) for r in batch)))
        first[batch] = now
        i = end


def _decode_instance(timing: TimingSource, reqs: Requests, mine: np.ndarray,
                     ready: np.ndarray, slots: int, last: np.ndarray) -> None:
    """Continuous batching on one decode instance; fills ``last`` for ``mine`` (in ready order)."""
    pending = deque(int(r) for r in mine)
    running: list[list[int]] = []  # [request, context, decode steps left]
    now = 0.0
    while pending or running:
        while pending and len(running) < slots and ready[pending[0]] <= now:
            r = pending.popleft()
            running.append([r, int(reqs.prompt_lens[r]), int(reqs.output_lens[r]) - 1])
        if not running:
            now = float(ready[pending[0]])
            continue
        now += timing.batch_time(BatchShape(decodes=tuple(x[1] for x in running)))
        still: list[list[int]] = []
        for x in running:
            x[1] += 1
            x[2] -= 1
            if x[2] <= 0:
                last[x[0]] = now
            else:
                still.append(x)
        running = still


def simulate_disaggregated_iterations(
        prefill_timing: TimingSource, decode_timing: TimingSource, reqs: Requests,
        prefill_instances: int, decode_instances: int, max_batch: int, decode_slots: int,
        max_tokens: int, kv_time: np.ndarray) -> Latencies:
    """Per-request TTFT and TPOT of a ``ypzd`` deployment, iteration by iteration."""
    if prefill_instances < 1 or decode_instances < 1:
        raise ValueError("instances: a disaggregated deployment needs >= 1 prefill and "
                         ">= 1 decode instance")
    if max_batch < 1 or decode_slots < 1 or max_tokens < 1:
        raise ValueError("max_batch, decode_slots, max_tokens: must be >= 1")
    n = len(reqs)
    first = np.empty(n)
    order = np.arange(n)
    for k in range(prefill_instances):
        _prefill_instance(prefill_timing, reqs, order[k::prefill_instances], max_batch,
                          max_tokens, first)
    ready = first + kv_time
    last = first.copy()  # a one-token request ends with its prefill
    by_ready = np.argsort(ready, kind="stable")
    by_ready = by_ready[reqs.output_lens[by_ready] > 1]
    for k in range(decode_instances):
        _decode_instance(decode_timing, reqs, by_ready[k::decode_instances], ready,
                         decode_slots, last)
    gaps = np.maximum(reqs.output_lens - 1, 1)
    tpot = np.where(reqs.output_lens > 1, (last - first) / gaps, 0.0)
    return Latencies(first - reqs.arrivals, tpot)
