"""Shared fixtures. Tests that need Redis read REDIS_URL (default 127.0.0.1:6379)."""

from __future__ import annotations

import os

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
