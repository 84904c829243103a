#!/usr/bin/env bash
# Strict mypy over the core. mypy cannot follow the package-dir mapping of an
# editable install (shared/ -> sloserve), so lay the package out with symlinks.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/sloserve"
for f in "$top"/shared/*; do ln -s "$f" "$root/sloserve/$(basename "$f")"; done
ln -s "$top/services" "$root/sloserve/services"
ln -s "$top/services/client" "$root/sloserve/client"
cd "$root" && mypy --strict --ignore-missing-imports -p "${1:-sloserve}" \
  --exclude 'sloserve/services/_gen' | grep -v '^sloserve/services/_gen' || true
