"""Observability: structlog JSON lines on stderr, prometheus-client on an optional port."""

from __future__ import annotations

import logging
import sys

import structlog


def setup_logging(service: str, level: str = "info") -> structlog.stdlib.BoundLogger:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
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
