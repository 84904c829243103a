"""BestServe's fast simulators (§3.4): prefill (Alg. 2), decode (Alg. 3), the disaggregated
tandem queue (§3.4.3) and the collocated vLLM-style simulator (Algs. 4-7).

They work per request, not per token: a decode request occupies one of its
instance's ``slots`` ("boxes") for ``(o - 1)`` steps, each timed at the pseudo
batch size ``b† = max(floor((b + 1) / τ), 1)`` fixed at insertion (eq. 9).
Instance choice among the available ones is uniformly random, the paper's
shuffle standing in for round-robin. Deterministic for a given ``rng``.

Read differently from the pseudo-code, on purpose:

* the pseudo-code's "advance to the next event" takes ``max(T_idle, next
  arrival)`` with ``T_idle = inf`` when every instance is idle; we advance to
  the earliest time at which something can happen;
* collocated decodes stay on the instance that prefilled them (the KV cache
  lives there, Fig. 1a); Alg. 7's shuffle would move them;
* a suspended decode (Alg. 6, lines 13-18) is modelled by pushing its finish
  time back by the prefill's duration, which is what resuming it later means;
* prefill batches also respect a token cap (vLLM's ``max_num_batched_tokens``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from sloserve.batch import BatchShape
from sloserve.plan.estimator import Estimator

PSEUDO_BATCH_TAU = 2.5  # §3.4.2


@dataclass(frozen=True, slots=True)
class Requests:
    """A fast-simulation workload: arrival times (sorted) and per-request lengths."""

    arrivals: np.ndarray  # seconds, non-decreasing
    prompt_lens: np.ndarray  # s
    output_lens: np.ndarray  # s_+ (the first token comes from the prefill)

    def __post_init__(self) -> None:
        n = len(self.arrivals)
        if n < 1 or len(self.prompt_lens) != n or len(self.output_lens) != n:
            raise ValueError("requests: arrivals, prompt_lens and output_lens need one equal, "
                             "non-zero length")
        if np.any(np.diff(self.arrivals) < 0):
            raise ValueError("requests: arrivals must be sorted")
        if self.prompt_lens.min() < 1 or self.output_lens.min() < 1:
            raise ValueError("requests: prompt and output lengths must be >= 1")

    def __len__(self) -> int:
        return len(self.arrivals)


@dataclass(frozen=True, slots=True)
class Latencies:
    """Per-request TTFT and TPOT (mean gap after the first token), seconds."""

    ttft: np.ndarray
    tpot: np.ndarray

    def p90(self) -> tuple[float, float]:
        return float(np.percentile(self.ttft, 90)), float(np.percentile(self.tpot, 90))


def pseudo_batch_size(b: int, tau: float = PSEUDO_BATCH_TAU) -> int:
    """Eq. 9: ``b† = max(floor((b + 1) / τ), 1)`` for ``b`` decodes already running."""
    if tau <= 0:
        raise ValueError(f"tau: must be > 0, got {tau}")
    return max(math.floor((b + 1) / tau), 1)


def prefill_batch_time(est: Estimator, prompts: np.ndarray) -> float:
    """Algorithm 1 for a prefill batch: the cached ``(b, s)`` oracle when all prompts are
    equal (the paper's case), the general batch form otherwise."""
    if prompts.min() == prompts.max():
        return est.estimate_time(len(prompts), int(prompts[0]), 0, "prefill")
    return est.batch_time(BatchShape(prefills=tuple((int(s), 0) for s in prompts)))


def decode_time(est: Estimator, running: int, s: int, o: int, tau: float) -> float:
    """A request's whole decode: ``o - 1`` steps at ``b†`` over ``s + o - 1`` tokens (Table 3b)."""
    if o <= 1:
        return 0.0
    return (o - 1) * est.estimate_time(pseudo_batch_size(running, tau), s, o - 1, "decode")


def _prefill_batch_end(prompts: np.ndarray, arrivals: np.ndarray, start: int, now: float,
                       max_batch: int, max_tokens: int, stop: int) -> int:
    """BATCH(): FCFS requests that arrived by ``now``, at most ``max_batch`` of them and
    ``max_tokens`` prompt tokens (always at least one)."""
    end, tokens = start, 0
    while (end < stop and end - start < max_batch and arrivals[end] <= now
           and (end == start or tokens + prompts[end] <= max_tokens)):
        tokens += int(prompts[end])
        end += 1
    return end


def simulate_prefill(est: Estimator, reqs: Requests, instances: int, max_batch: int,
                     max_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2: prefill departure (first-token) times."""
    n = len(reqs)
    depart = np.empty(n)
    when_idle = np.zeros(instances)
    now, i = 0.0, 0
    while i < n:
        now = max(now, reqs.arrivals[i], when_idle.min())
        idle = np.flatnonzero(when_idle <= now)
        k = idle[rng.integers(idle.size)]
        j = _prefill_batch_end(reqs.prompt_lens, reqs.arrivals, i, now, max_batch, max_tokens, n)
        dur = prefill_batch_time(est, reqs.prompt_lens[i:j])
        depart[i:j] = now + dur
        when_idle[k] = now + dur
        i = j
    return depart


def simulate_decode(est: Estimator, ready: np.ndarray, reqs: Requests, instances: int,
                    slots: int, rng: np.random.Generator, tau: float = PSEUDO_BATCH_TAU
                    ) -> np.ndarray:
    """Algorithm 3: decode departure times for requests ready at ``ready``, FCFS."""
    depart = np.empty(len(reqs))
    boxes = np.zeros((instances, slots))  # when each box becomes idle
    now = 0.0
    for r in np.argsort(ready, kind="stable"):
        now = max(now, ready[r])
        free = boxes <= now
        has_free = free.any(axis=1)
        if not has_free.any():
            now = float(boxes.min())
            free = boxes <= now
            has_free = free.any(axis=1)
        candidates = np.flatnonzero(has_free)
        k = candidates[rng.integers(candidates.size)]
        running = int(slots - free[k].sum())
        end = now + decode_time(est, running, int(reqs.prompt_lens[r]),
                                int(reqs.output_lens[r]), tau)
        boxes[k, int(np.argmax(free[k]))] = end
        depart[r] = end
    return depart


def _latencies(reqs: Requests, first: np.ndarray, last: np.ndarray) -> Latencies:
    gaps = np.maximum(reqs.output_lens - 1, 1)
    tpot = np.where(reqs.output_lens > 1, (last - first) / gaps, 0.0)
    return Latencies(first - reqs.arrivals, tpot)


def kv_transfer_time(est: Estimator, prompt_len: np.ndarray) -> np.ndarray:
    """Prefill-to-decode KV-cache move: each of the ``t`` shards over the interconnect at
    the prefill phase's ``e_+`` (the same link model as eq. 8)."""
    m, hw = est.model, est.hw
    rate = est.config.prefill.e_plus * hw.interconnect_bw
    out: np.ndarray = prompt_len * m.kv_bytes_per_token / est.tp / rate
    return out


def simulate_disaggregated(prefill_est: Estimator, decode_est: Estimator, reqs: Requests,
                           prefill_instances: int, decode_instances: int, max_batch: int,
                           decode_slots: int, max_tokens: int, rng: np.random.Generator,
                           tau: float = PSEUDO_BATCH_TAU) -> Latencies:
    """§3.4.3: the prefill simulator's departures, plus the KV transfer, feed the decoder."""
    first = simulate_prefill(prefill_est, reqs, prefill_instances, max_batch, max_tokens, rng)
    ready = first + kv_transfer_time(prefill_est, reqs.prompt_lens)
    last = simulate_decode(decode_est, ready, reqs, decode_instances, decode_slots, rng, tau)
    return _latencies(reqs, first, last)


def simulate_collocated(est: Estimator, reqs: Requests, instances: int, max_batch: int,
                        slots: int, max_tokens: int, rng: np.random.Generator,
                        tau: float = PSEUDO_BATCH_TAU, seq_cap: bool = False) -> Latencies:
    """Algorithms 4-7: vLLM-style collocation -- prefills first, never mixed with decodes,
    and a prefill suspends its instance's running decodes until it ends.

    ``seq_cap=False`` is the paper: prefills are admitted whatever the decode load.
    ``seq_cap=True`` adds vLLM's admission rule (running + waiting decodes never exceed
    ``slots`` = ``max_num_seqs``), so overload shows up in TTFT as on a real server.
    """
    n = len(reqs)
    first = np.full(n, np.inf)
    last = np.full(n, np.inf)
    prefill_until = np.zeros(instances)
    boxes = np.zeros((instances, slots))
    box_req = np.full((instances, slots), -1)
    queues: list[deque[int]] = [deque() for _ in range(instances)]
    arrivals, prompts, outputs = reqs.arrivals, reqs.prompt_lens, reqs.output_lens
    now, i, done = 0.0, 0, 0

    def start_prefill(k: int, end: int) -> None:
        nonlocal i
        dur = prefill_batch_time(est, prompts[i:end])
        suspended = boxes[k] > now  # Alg. 6 lines 13-18: running decodes wait for it
        boxes[k, suspended] += dur
        last[box_req[k, suspended]] += dur
        first[i:end] = now + dur
        prefill_until[k] = now + dur
        queues[k].extend(range(i, end))
        i = end

    while done < n:
        progressed = False
        if i < n and arrivals[i] <= now:  # WHAT_COMES_NEXT: prefill has priority
            idle = prefill_until <= now
            room = slots - (boxes > now).sum(axis=1) - np.array([len(q) for q in queues])
            if seq_cap:
                idle &= room > 0
            candidates = np.flatnonzero(idle)
            if candidates.size:
                k = int(candidates[rng.integers(candidates.size)])
                cap = int(room[k]) if seq_cap else max_batch
                start_prefill(k, _prefill_batch_end(prompts, arrivals, i, now,
                                                    min(max_batch, cap), max_tokens, n))
                progressed = True
        for k in rng.permutation(instances):  # PROCESS_DECODE on every available instance
            q = queues[k]
            while q and prefill_until[k] <= now and first[q[0]] <= now:
                free = boxes[k] <= now
                if not free.any():
                    break
                r = q.popleft()
                running = int(slots - free.sum())
                end = now + decode_time(est, running, int(prompts[r]), int(outputs[r]), tau)
                j = int(np.argmax(free))
                boxes[k, j], box_req[k, j], last[r] = end, r, end
                done += 1
                progressed = True
        if progressed:
            continue
        next_arrival = float(arrivals[i]) if i < n else np.inf
        now = _next_event(now, next_arrival, prefill_until, boxes, queues, first)
    return _latencies(reqs, first, last)


def _next_event(now: float, next_arrival: float, prefill_until: np.ndarray, boxes: np.ndarray,
                queues: list[deque[int]], first: np.ndarray) -> float:
    """Earliest future time at which an arrival, a prefill end, a decode's readiness or a
    freed box (which admits a waiting decode, or under ``seq_cap`` a prefill) happens."""
    busy = boxes[boxes > now]
    times = [next_arrival, *prefill_until[prefill_until > now]]
    if busy.size:
        times.append(float(busy.min()))
    times += [float(first[q[0]]) for q in queues if q]
    later = [t for t in times if t > now]
    if not later:
        raise RuntimeError("collocated simulator: no future event while work remains")
    return float(min(later))
