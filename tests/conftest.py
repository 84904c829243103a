"""Session-wide setup. The Redis every test uses is chosen once, when this file is
imported (before any other conftest or test module, which may read it at import), and
published in ``$REDIS_URL`` (tests read it with ``redis_source.redis_url()``; service
processes the tests start inherit it): ``$REDIS_URL`` if set, else a testcontainers
Redis when a Docker engine answers, else the local 127.0.0.1:6379
(``tests/redis_source.py``)."""

from __future__ import annotations

import atexit
import os

import pytest
import redis_source

_choice = redis_source.choose()
os.environ["REDIS_URL"] = _choice.url
atexit.register(_choice.close)  # a session that ends without pytest_unconfigure
_LINE = f"redis: {_choice.url} ({_choice.why})"


def pytest_report_header(config: pytest.Config) -> str:
    return _LINE


def pytest_sessionstart(session: pytest.Session) -> None:
    # the header is hidden under -q (our default addopts): say it once anyway
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and session.config.get_verbosity() < 0:
        tr.write_line(_LINE)


def pytest_unconfigure(config: pytest.Config) -> None:
    _choice.close()
