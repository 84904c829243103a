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
