"""Iteration-level SLOs (AccelGen §4.3): deadlines, remaining time, JCT → per-iteration slack.

Every request is judged one iteration (one token) at a time. An online
request's next token is due ``SLO`` after ``t0`` — its arrival for the first
token (TTFT), the previous token for later ones (TBT) — so the deadline is
``t0 + SLO`` and ``SLO - T_w = deadline - now``. Its remaining time is
``T_r = SLO - T_w - T_e`` with ``T_e = N_ck · T_max`` and ``N_ck = ⌈S_r / L_c⌉``
(1 for a decode). An offline request's JCT SLO is spread over its iterations
as an allowed waiting time per iteration whose over- or under-use carries over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sloserve.request import Request


def next_token_deadline(req: Request) -> float | None:
    """When ``req``'s next token is due (TTFT for the first, TBT after); ``None`` if no target."""
    if req.num_generated == 0:
        return req.ttft_deadline
    if req.slo.tbt is None:
        return None
    t0 = req.token_times[-1] if req.token_times else req.arrival_time
    return t0 + req.slo.tbt


def iteration_slo(req: Request) -> float | None:
    """The request's iteration-level SLO (TTFT before its first token, TBT after), §4.2 SLO_min."""
    return req.slo.ttft if req.num_generated == 0 else req.slo.tbt


def num_chunks(tokens: int, chunk_len: float) -> int:
    """``N_ck ≈ ⌈S_r / L_c⌉`` (§4.3); at least one iteration."""
    if chunk_len <= 0:
        raise ValueError(f"chunk_len: must be > 0, got {chunk_len}")
    return max(1, math.ceil(tokens / chunk_len))


def execution_time(req: Request, t_max: float, chunk_len: float) -> float:
    """``T_e ≈ N_ck · T_max`` for the request's next token (§4.3; ``N_ck = 1`` for a decode)."""
    return (1 if req.is_decode else num_chunks(req.num_uncomputed, chunk_len)) * t_max


def remaining_time(req: Request, now: float, t_max: float, chunk_len: float) -> float:
    """``T_r = SLO - T_w - T_e`` for the next token (Fig. 10); ``inf`` with no TTFT/TBT target."""
    deadline = next_token_deadline(req)
    if deadline is None:
        return math.inf
    return deadline - now - execution_time(req, t_max, chunk_len)


def jct_allowed_wait(
    jct_slo: float,
    prompt_len: int,
    output_len: int,
    chunk_len: float,
    t_max: float,
    preempt_max: float = 0.0,
    preempt_prob: float = 0.0,
) -> float:
    """Allowed waiting time per iteration, ``T_r = (SLO_JCT - T_e) / (N_ck + S_g)`` (§4.3).

    ``T_e ≈ N_ck·T_max + S_g·(T_max + P_max·P)``: ``N_ck`` prompt chunks, ``S_g``
    generated tokens, each possibly preempted for ``P_max`` with probability ``P``.
    Negative when the job cannot meet its JCT even without waiting.
    """
    if jct_slo <= 0:
        raise ValueError(f"jct_slo: must be > 0 seconds, got {jct_slo}")
    if t_max < 0 or preempt_max < 0 or not 0 <= preempt_prob <= 1:
        raise ValueError(
            f"jct_allowed_wait: need t_max >= 0, preempt_max >= 0, 0 <= preempt_prob <= 1; "
            f"got {t_max}, {preempt_max}, {preempt_prob}"
        )
    n_ck = num_chunks(prompt_len, chunk_len)
    t_e = n_ck * t_max + output_len * (t_max + preempt_max * preempt_prob)
    return (jct_slo - t_e) / (n_ck + output_len)


@dataclass(frozen=True, slots=True)
class JctSlack:
    """Per-iteration waiting allowance with carry-over (§4.3).

    ``allowed = per_iteration + carry``. Waiting ``d`` longer than allowed makes the
    next allowance ``per_iteration - d``; waiting ``d`` less makes it ``per_iteration + d``.
    """

    per_iteration: float
    carry: float = 0.0

    @property
    def allowed(self) -> float:
        return self.per_iteration + self.carry

    def after_wait(self, waited: float) -> JctSlack:
        """The allowance for the next iteration after this one waited ``waited`` seconds."""
        return JctSlack(self.per_iteration, self.allowed - waited)


@dataclass(slots=True)
class JctClock:
    """One JCT request's iteration clock: ``t0`` is when it (re-)entered the queue."""

    slack: JctSlack
    t0: float

    @property
    def latest_start(self) -> float:
        return self.t0 + self.slack.allowed

    def remaining_time(self, now: float) -> float:
        """Allowed waiting time left for this iteration: ``allowed - T_w``."""
        return self.latest_start - now

    def start_iteration(self, now: float) -> None:
        """The request was batched at ``now``: charge its wait and carry the difference."""
        self.slack = self.slack.after_wait(now - self.t0)

    def end_iteration(self, end_time: float) -> None:
        """The iteration returned at ``end_time``; the next wait counts from there."""
        self.t0 = end_time
