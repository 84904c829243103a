"""Prometheus families with vLLM's names (``vllm:...``, label ``model_name``) so existing
vLLM dashboards and llm-d's endpoint picker read a sloserve stack unchanged, plus
``sloserve:`` families for what vLLM has no name for (SLO attainment, goodput,
offloads, drops, policy decision time, perf-model error).

Which process exports what: the gateway the request-level families (TTFT, ITL, E2E,
token counters, running/waiting as the gateway sees them, SLO attainment, goodput,
offloads, drops); each scheduler its instance's running/waiting, KV usage,
preemptions, queue time, policy decision time and perf-model error; each executor its
batches (tokens per iteration, measured batch time); the perf-model service its refits.
Buckets are vLLM's (``vllm/v1/metrics/loggers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sloserve.controller import DROP_BY_POLICY

M = ["model_name"]
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# --- vLLM's names -------------------------------------------------------------------------
TTFT = Histogram("vllm:time_to_first_token_seconds", "Time to first token (gateway arrival "
                 "to the token leaving the gateway)", M, buckets=TTFT_BUCKETS)
ITL = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive output tokens",
                M, buckets=ITL_BUCKETS)
E2E = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token", M,
                buckets=LATENCY_BUCKETS)
REQUEST_QUEUE_TIME = Histogram("vllm:request_queue_time_seconds",
                       "Time a request waited on its instance before its first scheduling",
                       M, buckets=LATENCY_BUCKETS)
RUNNING = Gauge("vllm:num_requests_running", "Requests being generated", M)
WAITING = Gauge("vllm:num_requests_waiting", "Requests waiting for their first scheduling", M)
KV_USAGE = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 0..1", M)
PREEMPTIONS = Counter("vllm:num_preemptions", "Recompute preemptions", M)
PROMPT_TOKENS = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests", M)
GENERATION_TOKENS = Counter("vllm:generation_tokens", "Generated tokens", M)
REQUEST_SUCCESS = Counter("vllm:request_success", "Finished requests", M + ["finished_reason"])
ITERATION_TOKENS = Histogram("vllm:iteration_tokens_total", "Tokens per engine step (one "
                             "executed batch)", M, buckets=ITERATION_TOKENS_BUCKETS)



class PrefixCacheCounters(Collector):
    """vLLM's ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (prompt tokens
    looked up / found cached), one series per instance (label ``engine``, as vLLM's per
    engine): the gateway exports what each scheduler's ``InstanceState`` last said
    (issue 33, item 4). ``source``: model name and {instance: (queries, hits)}."""

    def __init__(self) -> None:
        self.source: Callable[[], tuple[str, Mapping[str, tuple[int, int]]]] | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        if self.source is None:
            return
        model, counts = self.source()
        labels = ["model_name", "engine"]
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prefix-cache queries "
                                      "(prompt tokens looked up)", labels=labels)
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prefix-cache hits (prompt "
                                   "tokens found cached)", labels=labels)
        for engine, (q, h) in sorted(counts.items()):
            queries.add_metric([model, engine], q)
            hits.add_metric([model, engine], h)
        yield queries
        yield hits


PREFIX_CACHE = PrefixCacheCounters()
REGISTRY.register(PREFIX_CACHE)

# --- sloserve's own ------------------------------------------------------------------------
SLO_REQUESTS = Counter("sloserve:slo_requests", "Finished requests by SLO outcome "
                       "(attainment = met / all)", M + ["slo_met"])
GOODPUT_TOKENS = Counter("sloserve:goodput_tokens", "Output tokens of requests that met "
                         "every SLO (rate(): goodput)", M)
OFFLOADS = Counter("sloserve:offloads", "Requests moved to another instance", M)
DROPS = Counter("sloserve:requests_dropped", "Requests dropped under overload, by the kind of "
                "reason (drop_label; the whole reason is in the request's log line)",
                M + ["reason"])
DECISION_TIME = Histogram(
    "sloserve:policy_decision_seconds", "The policy's scheduling decision (Instance.schedule)",
    M, buckets=(1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2))
BATCH_TIME = Histogram(
    "sloserve:batch_execution_seconds", "Measured time of one executed batch (executor)", M,
    buckets=(1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0))
PERF_REFITS = Counter("sloserve:perf_model_refits", "Perf-model fits published", M)
PERF_FIT_MAPE = Gauge("sloserve:perf_model_fit_mape", "The latest fit's mean absolute "
                      "percentage error over its sample window, 0..1", M)
PERF_ERROR = Histogram(
    "sloserve:perf_model_relative_error", "|predicted - measured| / measured batch time",
    M, buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0))


def drop_label(reason: str) -> str:
    """A drop reason's ``reason`` label: its kind, never its numbers (one series per kind,
    not per predicted TTFT). ``shed: predicted TTFT 1.1s ...`` is ``shed``, ``slack: ...``
    ``slack``, the controller's overload drop ``policy``, vLLM's too-long prompt
    ``prompt_too_long``, a refused field ``field: ...`` that field; else ``other``."""
    if reason == DROP_BY_POLICY:
        return "policy"
    if reason.startswith("Input prompt ("):  # vLLM's words (policies/vllm.py)
        return "prompt_too_long"
    kind, sep, _ = reason.partition(":")
    if sep and kind and len(kind) <= 32 and kind.replace("_", "").replace(".", "").isalnum():
        return kind
    return "other"
