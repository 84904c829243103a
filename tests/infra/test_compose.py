"""docker-compose.yml serves what ``sloserve up`` serves: gRPC on 50051 and OpenAI's
HTTP API (with /metrics) on 8000, both published on the host's loopback only. (The
stack itself runs in ``infra/compose_smoke.sh``, out of the default test run.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from sloserve.services.gateway.server import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_the_compose_gateway_serves_openai_http_on_8000_published_on_loopback() -> None:
    gw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["gateway"]
    module, *argv = [str(a) for a in gw["command"]]
    assert module == "sloserve.services.gateway"
    args = build_parser().parse_args(argv)  # the gateway's own flags, nothing else
    assert (args.port, args.http_port) == (50051, 8000)
    published = {p.rsplit(":", 1)[1]: p for p in gw["ports"]}
    assert set(published) == {"50051", "8000"}
    assert all(p.startswith("127.0.0.1:") for p in published.values())
    smoke = (ROOT / "infra" / "compose_smoke.sh").read_text()
    assert "SLOSERVE_HTTP_PORT" in smoke and "from openai import OpenAI" in smoke
