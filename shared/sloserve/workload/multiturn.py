"""A synthetic multi-turn chat workload with prefix identity (for prefix caching).

Conversations start as a Poisson process; each opens with one of a few
shared system prompts and runs a geometric number of turns. Turn ``k``'s
prompt is the whole conversation so far (system prompt, every earlier user
message and answer) plus a new user message, so it extends turn ``k-1``'s
context, as a chat client resends its history. The next turn arrives a think
time (exponential) after the previous one *arrived*: an open loop, so a turn
may arrive before its predecessor finished and then finds less of its context
cached. Conversations start ``max_turns * mean_think_s`` before time 0 and only
turns from time 0 are kept: a steady state, whose share of later turns does not
depend on the rate (a cold start would make a short, fast run all first turns).

Prefix identity is Mooncake's: ``hash_ids``, one id per ``PREFIX_UNIT`` (512)
tokens of the conversation's token stream (prompt then answer). A system
prompt is a whole number of units so that its ids are shared by every
conversation that uses it; a conversation's own units get ids of its own.
The request rate is ``qps``: conversations start at ``qps / mean turns``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from sloserve.kv_prefix import PREFIX_UNIT
from sloserve.request import SLO, Request
from sloserve.workload.generate import Workload

MULTITURN = "multiturn"  # the name ``--trace`` takes for this workload


@dataclass(frozen=True, slots=True)
class MultiTurnSpec:
    num_system_prompts: int = 4
    system_prompt_units: tuple[int, ...] = (1, 2, 4)  # lengths in PREFIX_UNIT tokens
    mean_turns: float = 4.0  # geometric number of turns per conversation
    max_turns: int = 12
    mean_user_tokens: float = 200.0  # lognormal (sigma 0.8) new user message per turn
    mean_output_tokens: float = 250.0  # lognormal (sigma 0.8) answer per turn
    mean_think_s: float = 15.0  # exponential gap between a turn's arrival and the next's

    def validate(self) -> None:
        if self.num_system_prompts < 1:
            raise ValueError(f"num_system_prompts: must be >= 1, got {self.num_system_prompts}")
        if not self.system_prompt_units or min(self.system_prompt_units) < 0:
            raise ValueError("system_prompt_units: give one or more lengths >= 0 (in units)")
        if not 1.0 <= self.mean_turns <= self.max_turns:
            raise ValueError(f"mean_turns: must be in [1, max_turns], got {self.mean_turns}")
        for name in ("mean_user_tokens", "mean_output_tokens", "mean_think_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")


def _lognormal(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    sigma = 0.8
    mu = math.log(mean) - sigma * sigma / 2
    out: np.ndarray = np.maximum(1, np.rint(rng.lognormal(mu, sigma, size))).astype(int)
    return out


def _enough(turns: list[tuple[float, int, int, tuple[int, ...], int]], n: int, start: float,
            conv: int) -> bool:
    if len(turns) < n or conv % 16:
        return False
    kth = float(np.partition(np.fromiter((t[0] for t in turns), float), n - 1)[n - 1])
    return start > kth


def multiturn_requests(
    *, num_requests: int, qps: float, seed: int = 0, ttft_slo: float | None = None,
    tbt_slo: float | None = None, max_context: int | None = None,
    spec: MultiTurnSpec | None = None,
) -> Workload:
    """``num_requests`` turns of multi-turn conversations (the first ones by arrival)."""
    spec = MultiTurnSpec() if spec is None else spec
    spec.validate()
    if num_requests < 1:
        raise ValueError(f"num_requests (--num-requests): must be >= 1, got {num_requests}")
    if not (math.isfinite(qps) and qps > 0):
        raise ValueError(f"qps (--qps): must be a positive number of requests/s, got {qps!r}")
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    ids = itertools.count(1)
    systems = []
    for _ in range(spec.num_system_prompts):
        units = int(rng.choice(spec.system_prompt_units))
        systems.append([next(ids) for _ in range(units)])
    conv_rate = qps / spec.mean_turns
    turns: list[tuple[float, int, int, tuple[int, ...], int]] = []  # arrival, p, o, ids, conv
    # steady state: conversations start from -warmup and only turns from time 0 are kept,
    # so the mix of first and later turns does not depend on qps or on num_requests (the
    # cache starts cold for conversations already under way)
    warmup = spec.max_turns * spec.mean_think_s
    start, conv, too_long = -warmup, 0, 0
    # until no later conversation can arrive among the first num_requests turns
    while not _enough(turns, num_requests, start, conv):
        start += float(rng.exponential(1.0 / conv_rate))
        system = systems[int(rng.integers(len(systems)))]
        n_turns = min(spec.max_turns, int(rng.geometric(1.0 / spec.mean_turns)))
        users = _lognormal(rng, spec.mean_user_tokens, n_turns)
        outs = _lognormal(rng, spec.mean_output_tokens, n_turns)
        gaps = rng.exponential(spec.mean_think_s, n_turns)
        stream = list(system)
        context, t = len(system) * PREFIX_UNIT, start
        for k in range(n_turns):
            prompt, out = context + int(users[k]), int(outs[k])
            if max_context is not None and prompt + out > max_context:
                too_long += 1
                break
            total_units = -(-(prompt + out) // PREFIX_UNIT)
            while len(stream) < total_units:
                stream.append(next(ids))
            if t >= 0:
                turns.append((t, prompt, out, tuple(stream[:total_units]), conv))
            context = prompt + out
            t += float(gaps[k])
        conv += 1
    turns.sort(key=lambda x: x[0])
    turns = turns[:num_requests]
    t0 = turns[0][0]
    requests = [
        Request(f"r{i:06d}", a - t0, p, o, slo=SLO(ttft=ttft_slo, tbt=tbt_slo), hash_ids=h)
        for i, (a, p, o, h, _) in enumerate(turns)
    ]
    info: dict[str, object] = {
        "workload": "multiturn",
        "num_requests": len(requests),
        "conversations": len({c for *_, c in turns}),
        "qps": qps,
        "seed": seed,
        "mean_prompt_len": float(np.mean([r.prompt_len for r in requests])),
        "mean_output_len": float(np.mean([r.output_len for r in requests])),
        "turns_cut_at_max_context": too_long,
    }
    return Workload(requests, 0, info)
