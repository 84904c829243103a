"""One metrics view on the API port (issue 35, item 3): after a short live bench on a sim
stack of 2 instances, every metric name vLLM's published Grafana dashboard queries
(``infra/grafana/vllm.json`` holds its queries) has samples on the API port, per instance
(label ``engine``); and with N requests held in flight, running + waiting summed over
engines and over every scrape target is N (no double count)."""

from __future__ import annotations

import json
import re
import socket
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sloserve.services.stack import Stack
from sloserve.services.store import free_port

VLLM_DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "vllm.json"
_FAMILY = re.compile(r"\b(vllm:[A-Za-z0-9_:]+)")
Samples = dict[str, list[tuple[dict[str, str], float]]]


def _scrape(url: str) -> Samples:
    out: Samples = defaultdict(list)
    for fam in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


def _engines(stack: Stack) -> set[str]:
    return {n.removeprefix("scheduler-") for n in stack.services if n.startswith("scheduler-")}


def _complete(stack: Stack, i: int) -> None:
    httpx.post(stack.http + "/v1/completions", timeout=60, json={
        "prompt": "tell me " * (1 + i % 5), "max_tokens": 4 + i % 4}).raise_for_status()


def test_every_metric_vllms_dashboard_queries_has_engine_samples_on_the_api_port(
        start_stack: Callable[..., Stack]) -> None:
    stack = start_stack(http_port=free_port(), metrics=True, instances=2, time_scale=0.02)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: _complete(stack, i), range(12)))
    dash = json.loads(VLLM_DASHBOARD.read_text())
    used = {n for p in dash["panels"] for t in p["targets"] for n in _FAMILY.findall(t["expr"])}
    assert len(used) >= 15, used
    samples = _scrape(stack.http + "/metrics")
    engines = _engines(stack)
    for name in sorted(used):
        assert samples.get(name), f"{name}: no sample on the API port"
        assert all(labels.get("engine") in engines for labels, _ in samples[name]), name
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:cache_config_info"):
        assert {labels["engine"] for labels, _ in samples[name]} == engines, name
    e2e = samples["vllm:e2e_request_latency_seconds_count"]
    counts = {labels["engine"]: v for labels, v in e2e}
    assert sum(counts.values()) == 12 and set(counts) == engines, counts  # both served
    for name in ("vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
                 "vllm:request_decode_time_seconds_count",
                 "vllm:request_inference_time_seconds_count",
                 "vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count"):
        assert sum(v for _, v in samples[name]) == 12, name
    gen = sum(v for _, v in samples["vllm:generation_tokens_total"])
    assert gen == sum(4 + i % 4 for i in range(12))
    assert sum(v for _, v in samples["vllm:request_generation_tokens_sum"]) == gen


def _hold(stack: Stack, n: int) -> list[socket.socket]:
    """``n`` streamed requests that run for minutes (slowed sim, long max_tokens)."""
    host, _, port = stack.http.removeprefix("http://").partition(":")
    socks = []
    for _ in range(n):
        raw = json.dumps({"prompt": "hold", "max_tokens": 4000, "stream": True}).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(raw), raw))
        socks.append(sock)
    return socks


def _in_flight(stack: Stack) -> tuple[float, float, float]:
    """running + waiting: on the API port summed over engines, summed over every scrape
    target (API port, schedulers', executors', perf model's; the gateway's own metrics port
    serves the API port's registry, so it is one target), and the gateway's own view."""
    targets = [stack.http + "/metrics"] + [f"http://{s.metrics}/metrics" for name, s in
                                           stack.services.items()
                                           if s.metrics and name != "gateway"]
    total = {"api": 0.0, "all": 0.0, "gateway": 0.0}
    for i, url in enumerate(targets):
        got = _scrape(url)
        vllm = sum(v for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
                   for _, v in got.get(name, []))
        total["all"] += vllm
        if i == 0:
            total["api"] = vllm
            total["gateway"] = sum(v for name in ("sloserve:gateway_requests_running",
                                                  "sloserve:gateway_requests_waiting")
                                   for _, v in got.get(name, []))
    return total["api"], total["all"], total["gateway"]


def test_running_plus_waiting_summed_over_engines_is_the_requests_in_flight(
        start_stack: Callable[..., Stack]) -> None:
    n = 6
    stack = start_stack(http_port=free_port(), metrics=True, instances=2, time_scale=10.0)
    socks = _hold(stack, n)
    seen: list[tuple[float, float, float]] = []
    deadline = time.monotonic() + 30
    try:
        while not seen or seen[-1] != (n, n, n):
            assert time.monotonic() < deadline, seen[-5:]
            seen.append(_in_flight(stack))
            time.sleep(0.05)
        for _ in range(5):  # held: it stays N while they generate
            time.sleep(0.2)
            seen.append(_in_flight(stack))
            assert seen[-1] == (n, n, n), seen[-1]
        assert max(max(s) for s in seen) <= n, seen  # never more than there are
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 30
    while _in_flight(stack) != (0, 0, 0):
        assert time.monotonic() < deadline, _in_flight(stack)
        time.sleep(0.1)
