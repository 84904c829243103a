"""``--log-level`` / ``$SLOSERVE_LOG_LEVEL`` reach every service of a stack."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sloserve.client import Client
from sloserve.services.obs import log_level
from sloserve.services.stack import Stack


def test_log_level_from_flag_env_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLOSERVE_LOG_LEVEL", raising=False)
    assert log_level() == "info"
    monkeypatch.setenv("SLOSERVE_LOG_LEVEL", "WARNING")
    assert log_level() == "warning" and log_level("debug") == "debug"
    with pytest.raises(ValueError, match="log level: must be one of"):
        log_level("loud")


def test_warning_level_silences_the_per_request_lines(start_stack: Callable[..., Stack],
                                                      tmp_path: Path) -> None:
    quiet = start_stack(log_level="warning", time_scale=0.02)
    loud = start_stack(time_scale=0.02)
    for s in (quiet, loud):
        assert len(list(Client(s.gateway).generate("hi", max_tokens=2))) == 2
        s.stop()  # flush the logs
    logs = sorted(tmp_path.glob("logs*"))
    assert '"event": "request"' not in (logs[0] / "gateway.log").read_text()
    assert '"event": "request"' in (logs[1] / "gateway.log").read_text()
    assert '"level": "info"' not in (logs[0] / "scheduler-lp0.log").read_text()


def test_at_debug_a_request_id_is_in_every_service_log_it_passed(
        start_stack: Callable[..., Stack], tmp_path: Path) -> None:
    """The id a client sets travels in every message about the request (the calls between
    services are long-lived streams of many requests), and each service logs it."""
    import json

    s = start_stack(log_level="debug", time_scale=0.02)
    assert len(list(Client(s.gateway).generate("hi", max_tokens=3, request_id="trace-7"))) == 3
    s.stop()  # flush the logs
    logs = next(tmp_path.glob("logs*"))

    def events(name: str) -> list[str]:
        out = []
        for raw in (logs / f"{name}.log").read_text().splitlines():
            rec = json.loads(raw) if raw.startswith("{") else {}
            if rec.get("request_id") == "trace-7":
                out.append(str(rec["event"]))
        return out

    assert "request" in events("gateway")
    sched = events("scheduler-lp0")
    assert sched[0] == "request_admitted" and sched[-1] == "request_released", sched
    assert "sequence_added" in events("executor-lp0")
