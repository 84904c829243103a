#!/bin/sh
# Generate the gRPC/protobuf code ahead of time (it is otherwise generated on first
# import of sloserve.services.proto, into services/_gen/, git-ignored).
set -e
cd "$(dirname "$0")/.."
python -c "from sloserve.services.proto import ensure_generated; print(ensure_generated())"
