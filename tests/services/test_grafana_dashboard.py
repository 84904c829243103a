"""The Grafana dashboards (ours and vLLM's published one's queries) query only metric
families our services export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from sloserve.services import metrics

#: a metric name (digits included: ``vllm:e2e_...``), with or without a label selector
_FAMILY = re.compile(r"\b((?:vllm|sloserve):[A-Za-z0-9_:]+)")
GRAFANA = Path(__file__).resolve().parents[2] / "infra" / "grafana"


@pytest.fixture
def one_engine() -> Iterator[None]:
    """The gateway's per-engine families, as they are with one instance reporting."""
    metrics.ENGINES.source = lambda: ("m", {"i0": metrics.EngineState()})
    yield
    metrics.ENGINES.source = None


@pytest.mark.parametrize("dashboard", ["sloserve.json", "vllm.json"])
def test_every_dashboard_query_names_an_exported_family(dashboard: str,
                                                        one_engine: None) -> None:
    dash = json.loads((GRAFANA / dashboard).read_text())
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",)}
    exported = {m.name + sfx for m in REGISTRY.collect() for sfx in suffixes.get(m.type, ())}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    used = {name for e in exprs for name in _FAMILY.findall(e)}
    assert len(used) >= 14 if dashboard == "sloserve.json" else len(used) >= 15
    assert used <= exported, used - exported


def test_family_names_with_digits_are_read_whole() -> None:
    expr = 'rate(vllm:e2e_request_latency_seconds_bucket{model_name=~"$m"}[1m])'
    assert _FAMILY.findall(expr) == ["vllm:e2e_request_latency_seconds_bucket"]
