#!/usr/bin/env bash
# Strict mypy over the whole package (configuration in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
exec mypy "$@"
