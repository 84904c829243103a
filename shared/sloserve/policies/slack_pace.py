"""``slack``'s decode pacing (docs/lab/beyond.md, "Our policy": the GPU idles for the next
prompt; measured under "The GPU idles for the next prompt").

An iteration cannot be interrupted, so a prompt that arrives while a decode-only iteration
runs waits for its end before its prefill can start. For a prompt whose TTFT SLO is within
one such iteration of its prefill alone (AccelGen §3's mix gives SLOs of 0.5-1.5 x the
prefill), that wait is what makes it late, and whether it comes is the luck of the phase.
A decode seldom needs its token at once: its TBT SLO is several iterations long. So while
only decodes run and nothing waits, the next decode-only iteration is *held* (the GPU idles,
the driver's timer wakes the policy) until the first of

* a decode's gap reaches ``pace`` x its TBT SLO (the pooled gaps stay well within it), or
* the tightest decode's slack falls to what a prompt of the ``pace_quantile`` length among
  the last ``WINDOW`` arrivals needs to run whole beside the decodes under the TBT budget
  (``tbt_margin``): holding must not chunk the prompts it is meant to serve,

and a prompt that arrives meanwhile starts at once. It holds only while the last ``WINDOW``
arrivals include a *phase-tight* prompt, one whose TTFT slack alone (SLO less predicted
prefill, >= 0) is under ``pace_gate`` x the decode-only iteration: with loose TTFTs (1 s)
the wait costs nothing and holding would only narrow the budget. None of the four papers
holds a decode; vLLM and Sarathi-Serve run one whenever the GPU is free.
"""

from __future__ import annotations

import math
from collections import deque

from sloserve.batch import BatchShape
from sloserve.policies.base import InstanceView
from sloserve.policies.slack_config import SlackConfig
from sloserve.request import Request
from sloserve.slo import next_token_deadline

WINDOW = 64  # arrivals remembered: prompt lengths and TTFT slack alone


class DecodePacer:
    """The recent arrivals of one instance, and when a held decode-only iteration runs."""

    __slots__ = ("_recent",)

    def __init__(self) -> None:
        self._recent: deque[tuple[int, float]] = deque(maxlen=WINDOW)  # (prompt, slack alone)

    def arrived(self, prompt_tokens: int, slack_alone: float) -> None:
        """A new request: its prompt work and TTFT SLO less its predicted prefill alone
        (``inf`` without a TTFT SLO, negative if it can never make it)."""
        self._recent.append((prompt_tokens, slack_alone))

    def wake_at(self, view: InstanceView, decodes: list[Request], cfg: SlackConfig
                ) -> float | None:
        """When the decode-only iteration of ``decodes`` should run, if later than now;
        ``None``: run it now (pacing off, no phase-tight arrival, or no slack to give)."""
        if not cfg.pace or not self._recent:
            return None
        dec = tuple(r.num_computed for r in decodes)
        predict = view.perf_model.predict
        one = predict(BatchShape(decodes=dec))
        if not any(0.0 <= s < cfg.pace_gate * one for _, s in self._recent):
            return None
        wake = deadline = math.inf  # the first held gap's end; the tightest next token
        for r in decodes:
            due = next_token_deadline(r)
            if r.slo.tbt is None or not r.token_times or due is None:
                continue
            wake = min(wake, r.token_times[-1] + cfg.pace * r.slo.tbt)
            deadline = min(deadline, due)
        if deadline == math.inf:
            return None
        lengths = sorted(p for p, _ in self._recent)
        length = lengths[min(len(lengths) - 1, int(cfg.pace_quantile * len(lengths)))]
        whole = predict(BatchShape(prefills=((max(length, 1), 0),), decodes=dec))
        wake = min(wake, deadline - whole / cfg.tbt_margin)
        return wake if wake > view.now else None
