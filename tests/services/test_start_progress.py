"""Start-up progress (issue 35): ``up`` says what each starting service is doing, from its
log (our executor's events, vLLM's own lines), with the time since the start."""

from __future__ import annotations

from pathlib import Path

from redis_source import redis_url

from sloserve.services.stack import Stack, StackConfig, elapsed, start_phase
from sloserve.services.store import free_port

# lines as vLLM's CPU model runner, compilation monitor and engine core log them
VLLM_START = [
    '{"service": "executor", "backend": "vllm", "event": "loading", "level": "info"}',
    "INFO [cpu_model_runner.py:68] Starting to load model /m/smollm2-135m...",
    "INFO [default_loader.py:291] Loading weights took 0.41 seconds",
    "INFO [cpu_model_runner.py:87] Warming up model for the compilation...",
    "INFO [monitor.py:40] Starting torch.compile",
    "INFO [backends.py:382] Compiling a graph for dynamic shape takes 61.2 s",
    "INFO [cpu_model_runner.py:91] Warming up done.",
    "INFO [core.py:250] init engine (profile, create kv cache, warmup model) took 182.1 s",
    '{"service": "executor", "event": "warming_up", "level": "info"}',
]


def test_the_phase_is_the_newest_line_that_names_one() -> None:
    seen = [start_phase(VLLM_START[:k]) for k in range(len(VLLM_START) + 1)]
    assert seen == [None, "loading the model", "loading the model", "loading the model",
                    "compiling the model", "compiling the model", "compiling the model",
                    "warming up", "warm-up sweep (perf-model samples)",
                    "warm-up sweep (perf-model samples)"]
    assert start_phase(["unrelated", *VLLM_START[:2], "DEBUG something else"]) == (
        "loading the model")
    scheduler = ['{"service": "scheduler", "event": "waiting_for_executor", "level": "info"}',
                 '{"service": "scheduler", "event": "waiting_for_perf_model", "level": "info"}']
    assert [start_phase(scheduler[:k]) for k in (1, 2)] == [
        "waiting for its executor", "waiting for the perf model's first fit"]
    assert (elapsed(4.9), elapsed(65), elapsed(3600)) == ("4 s", "1 min 05 s", "60 min 00 s")


def test_a_stack_reports_each_service_started_with_the_time_since_the_start(
        tmp_path: Path) -> None:
    lines: list[str] = []
    # a random key prefix: stop() forgets its keys
    stack = Stack(StackConfig(gateway_port=free_port(), redis_url=redis_url(), log_dir=tmp_path))
    try:
        stack.start(progress=lines.append)
    finally:
        stack.stop()
    started = [ln.split()[1] for ln in lines if ln.startswith("started ")]
    assert started == list(stack.services), lines  # in start order, each once
    assert all(ln.endswith(" s)") for ln in lines), lines
