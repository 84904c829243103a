"""What the gateway does with a request's output: stop strings, metrics, its log line.

Stop strings (vLLM's ``SamplingParams.stop``) are matched on the detokenized text
here, for every backend: the output ends before the first match (the string itself
is not returned, vLLM's default) with ``finish_reason`` ``stop``. While streaming,
the last ``max(len(stop)) - 1`` characters are held back until they cannot begin a
match, as vLLM does, so no client ever sees part of a stop string.

At its end each request gives one structured log line and its metrics
(:mod:`sloserve.services.metrics`): TTFT, mean TBT, E2E and SLO met are judged as
``sloserve.metrics.summarize`` judges them (TTFT <= its SLO, mean TBT <= its SLO,
JCT <= its SLO; a one-token request passes TBT).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog
from prometheus_client import Counter, Histogram

from sloserve.services import metrics
from sloserve.services.proto import common_pb2, scheduler_pb2


class StopStrings:
    """Incremental stop-string matching with hold-back."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def push(self, text: str, last: bool) -> tuple[str, bool]:
        """The text to emit now and whether a stop string was hit (then nothing follows)."""
        self.pending += text
        hits = [i for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        if last or self.hold == 0:
            out, self.pending = self.pending, ""
            return out, False
        cut = max(0, len(self.pending) - self.hold)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False


@dataclass(slots=True)
class Timeline:
    """One request's timing at the gateway, fed as its tokens leave."""

    model: str
    arrival: float
    prompt_tokens: int
    max_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    engine: str = ""  # the instance of the latest token (vLLM's ``engine`` label)
    prefill_time: float = 0.0  # first scheduling to first token, as its scheduler said

    def tokens(self, times: list[float], engine: str, first: scheduler_pb2.TokenEvent) -> None:
        """Tokens that reached the gateway at ``times`` from instance ``engine`` (``first``
        is the earliest of them): one ITL/TPOT sample per gap, as if they left one by one;
        a request's first token carries its queue and prefill time on that instance
        (issue 35, item 3). The labelled children are looked up once per instance, the
        gaps observed in one go (``metrics.observe_all``)."""
        m, self.engine = self.model, engine
        prev = self.token_times[-1] if self.token_times else None
        if prev is None:
            metrics.TTFT.labels(m, engine).observe(times[0] - self.arrival)
            metrics.PROMPT_TOKENS.labels(m, engine).inc(self.prompt_tokens)
            metrics.REQUEST_QUEUE_TIME.labels(m, engine).observe(first.queue_time)
            metrics.PREFILL_TIME.labels(m, engine).observe(first.prefill_time)
            self.prefill_time = first.prefill_time
            prev = times[0]
            gaps = times[1:]
        else:
            gaps = times
        itl, tpot, gen = _children(m, engine)
        if gaps:
            diffs = [t - p for t, p in zip(gaps, [prev, *gaps[:-1]])]
            metrics.observe_all((itl, tpot), diffs)
        self.token_times.extend(times)
        gen.inc(len(times))

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def mean_tbt(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    def slo_met(self, spec: common_pb2.RequestSpec) -> bool:
        ttft, tbt = self.ttft, self.mean_tbt
        if ttft is None:
            return False
        if spec.HasField("ttft_slo") and ttft > spec.ttft_slo:
            return False
        if spec.HasField("tbt_slo") and tbt is not None and tbt > spec.tbt_slo:
            return False
        return not (spec.HasField("jct_slo")
                    and self.token_times[-1] - self.arrival > spec.jct_slo)

    def finish(self, log: structlog.stdlib.BoundLogger, spec: common_pb2.RequestSpec,
               instance: str, policy: str, finish_reason: str, drop_reason: str = "") -> None:
        """Metrics and the one log line of a request that ended (any way); ``drop_reason``:
        what the scheduler said of a dropped one."""
        m, n = self.model, len(self.token_times)
        cls = metrics.slo_class(spec.HasField("ttft_slo"), spec.HasField("tbt_slo"),
                                spec.HasField("jct_slo"))
        met = finish_reason in ("stop", "length") and self.slo_met(spec)
        if finish_reason in ("stop", "length"):
            e = self.engine or instance
            decode = self.token_times[-1] - self.token_times[0]
            metrics.E2E.labels(m, e).observe(self.token_times[-1] - self.arrival)
            metrics.REQUEST_SUCCESS.labels(m, e, finish_reason).inc()
            metrics.DECODE_TIME.labels(m, e).observe(decode)
            metrics.INFERENCE_TIME.labels(m, e).observe(self.prefill_time + decode)
            metrics.REQUEST_PROMPT_TOKENS.labels(m, e).observe(self.prompt_tokens)
            metrics.REQUEST_GENERATION_TOKENS.labels(m, e).observe(n)
            metrics.REQUEST_MAX_GENERATION_TOKENS.labels(m, e).observe(n)
            metrics.REQUEST_MAX_TOKENS.labels(m, e).observe(self.max_tokens)
            if n > 1:
                metrics.REQUEST_TPOT.labels(m, e).observe(decode / (n - 1))
            metrics.SLO_REQUESTS.labels(m, cls, str(met).lower()).inc()
            if met:
                metrics.GOODPUT_TOKENS.labels(m).inc(n)
        elif finish_reason == "dropped":  # attainment is met / all, as summarize counts it:
            metrics.SLO_REQUESTS.labels(m, cls, "false").inc()  # a drop never meets its SLOs
        log.info("request", request_id=spec.request_id, instance=instance, policy=policy,
                 prompt_tokens=self.prompt_tokens, output_tokens=n,
                 ttft_s=_r(self.ttft), mean_tbt_s=_r(self.mean_tbt), slo_met=met,
                 finish_reason=finish_reason, num_offloads=spec.num_offloads,
                 ttft_slo_s=spec.ttft_slo if spec.HasField("ttft_slo") else None,
                 tbt_slo_s=spec.tbt_slo if spec.HasField("tbt_slo") else None,
                 priority=spec.priority, **({"drop_reason": drop_reason} if drop_reason else {}))


_Children = tuple[Histogram, Histogram, Counter]
_CHILDREN: dict[tuple[str, str], _Children] = {}


def _children(model: str, engine: str) -> _Children:
    """ITL, TPOT and generation tokens labelled (``model``, ``engine``), looked up once."""
    c = _CHILDREN.get((model, engine))
    if c is None:
        c = _CHILDREN[model, engine] = (metrics.ITL.labels(model, engine),
                                        metrics.TPOT.labels(model, engine),
                                        metrics.GENERATION_TOKENS.labels(model, engine))
    return c


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
