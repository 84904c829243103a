"""The keys every ``sloserve bench`` result has, whichever endpoint served it."""

from __future__ import annotations

from sloserve.metrics import summarize
from sloserve.request import Request
from sloserve.services.bench_metrics import PER_REQUEST_KEYS

# vllm bench serve's names (vLLM 0.32.0 benchmarks/serve.py), default --percentile-metrics
VLLM_KEYS = {"completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "input_throughput", "output_throughput",
             "total_token_throughput"} | {
    f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p99")}
# who served the run (bench_cmd.replay, bench_openai.replay), and the trace rows too long
# for the model's context that were never sent (issue 38)
EXTRA_KEYS = {"policy", "instances", "model", "qps", "request_rate", "seed", "measured",
              "offloads", "endpoint", "target", "too_long"}
# our SLO metrics: sloserve simulate's summary
SLO_KEYS = set(summarize([Request("x", 0.0, 1, 1)]))
SCALAR_KEYS = VLLM_KEYS | EXTRA_KEYS | SLO_KEYS  # what --json prints
RESULT_KEYS = SCALAR_KEYS | PER_REQUEST_KEYS  # what --result-file writes
