"""The Grafana dashboard queries only metric families our services export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import sloserve.services.metrics  # noqa: F401 - registers the families

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "sloserve.json"


def test_every_dashboard_query_names_an_exported_family() -> None:
    dash = json.loads(DASHBOARD.read_text())
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",)}
    exported = {m.name + sfx for m in REGISTRY.collect() for sfx in suffixes.get(m.type, ())}
    used = {name for p in dash["panels"] for t in p["targets"]
            for name in re.findall(r"\b((?:vllm|sloserve):[a-z_]+)\{", t["expr"])}
    assert len(used) >= 14
    assert used <= exported, used - exported
