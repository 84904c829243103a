"""The API port's per-engine families and the SLO-class label (issue 35, item 3), without a
stack: values come from the engines' last ``InstanceState``; the class label is bounded."""

from __future__ import annotations

import itertools

from sloserve.services import metrics


def test_slo_class_names_the_slos_a_request_carries_and_has_eight_values() -> None:
    assert metrics.slo_class(True, True, False) == "ttft+tbt"
    assert metrics.slo_class(False, False, False) == "none"
    assert len({metrics.slo_class(*f) for f in itertools.product([False, True], repeat=3)}) == 8


def test_engine_states_export_each_instances_queues_and_kv_usage_under_its_engine() -> None:
    engines = {"a": metrics.EngineState(2, 3, 16, 64, 1, 16), "b": metrics.EngineState()}
    collector = metrics.EngineStates()
    collector.source = lambda: ("m", engines)
    got = {(s.name, s.labels["engine"]): s.value
           for fam in collector.collect() for s in fam.samples}
    assert got[("vllm:num_requests_running", "a")] == 2
    assert got[("vllm:num_requests_waiting", "a")] == 3
    assert got[("vllm:kv_cache_usage_perc", "a")] == got[("vllm:gpu_cache_usage_perc", "a")] == 0.25
    assert got[("vllm:num_preemptions_total", "a")] == 1
    assert got[("vllm:kv_cache_usage_perc", "b")] == 0.0  # no blocks reported yet: 0, not an error
    assert sum(v for (n, _), v in got.items() if n == "vllm:cache_config_info") == 2
    assert list(metrics.EngineStates().collect()) == []  # no source (not the gateway): nothing


def test_waiting_by_reason_puts_the_whole_queue_under_capacity_as_vllm_sums_it() -> None:
    """vLLM's ``num_requests_waiting_by_reason`` (issue 35): capacity + deferred = waiting."""
    collector = metrics.EngineStates()
    collector.source = lambda: ("m", {"a": metrics.EngineState(2, 3, 16, 64, 1, 16)})
    got = {(s.name, s.labels.get("reason")): s.value
           for fam in collector.collect() for s in fam.samples}
    assert got[("vllm:num_requests_waiting_by_reason", "capacity")] == 3
    assert got[("vllm:num_requests_waiting_by_reason", "deferred")] == 0
