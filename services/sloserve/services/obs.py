"""Observability: structlog JSON lines on stderr, prometheus-client on an optional port.

The log level is ``--log-level`` (every service) or ``$SLOSERVE_LOG_LEVEL``, default info.
Metric families (vLLM's names, ``sloserve:`` for ours) live in
:mod:`sloserve.services.metrics`.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

LOG_LEVEL_ENV = "SLOSERVE_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level(value: str | None = None) -> str:
    """``value``, else ``$SLOSERVE_LOG_LEVEL``, else ``info`` (raises naming the bad one)."""
    level = (value or os.environ.get(LOG_LEVEL_ENV) or "info").lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"log level: must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level


def setup_logging(service: str, level: str | None = None) -> structlog.stdlib.BoundLogger:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[log_level(level).upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    log: structlog.stdlib.BoundLogger = structlog.get_logger().bind(service=service)
    return log


def start_metrics(port: int | None, host: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` on ``host:port`` (no-op for ``None``/0)."""
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, addr=host)
