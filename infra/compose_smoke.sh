#!/usr/bin/env bash
# docker-compose.yml for real: build the images, start the stack, bench 100 requests
# through the gateway (with an API key), tear everything down. Minutes (the first
# build installs the dependencies), so it is not part of the default test run.
# Needs a Docker engine (../shared/tools/container-engine on our machines) and, on this
# host, `sloserve` importable (the bench client).
#   infra/compose_smoke.sh [RESULT_JSON]      # exit 0: every request finished
# SLOSERVE_DESCRIPTION=infra/deployments/compose-4.yaml runs the compose file `sloserve
# render compose` makes from that description instead of the checked-in one (issue 34);
# SLOSERVE_SMOKE_REQUESTS=50 benches 50 requests instead of 100. Issue 34's acceptance:
#   SLOSERVE_DESCRIPTION=infra/deployments/compose-4.yaml SLOSERVE_SMOKE_REQUESTS=50 \
#     infra/compose_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
result=${1:-$(mktemp --suffix=.json)}
requests=${SLOSERVE_SMOKE_REQUESTS:-100}
project=sloserve-smoke-$$
export SLOSERVE_REDIS_PASSWORD=$(python -c "import secrets; print(secrets.token_hex(24))")
export SLOSERVE_INTERNAL_TOKEN=$(python -c "import secrets; print(secrets.token_hex(32))")
export SLOSERVE_API_KEYS=smoke-$(python -c "import secrets; print(secrets.token_hex(8))")
export SLOSERVE_API_KEY=$SLOSERVE_API_KEYS  # the bench client's key
free_port() { python -c \
  "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
export SLOSERVE_GATEWAY_PORT=${SLOSERVE_GATEWAY_PORT:-$(free_port)}
export SLOSERVE_HTTP_PORT=${SLOSERVE_HTTP_PORT:-$(free_port)}
compose_file=docker-compose.yml
if [ -n "${SLOSERVE_DESCRIPTION:-}" ]; then
  compose_file=$(mktemp --suffix=.yml)
  python -m sloserve.services.cli render compose "$SLOSERVE_DESCRIPTION" --out "$compose_file"
fi
compose() { docker compose -p "$project" -f "$compose_file" --project-directory . "$@"; }
trap 'compose logs --no-color --tail 20 >&2 || true; compose down -v --remove-orphans' ERR
trap 'compose down -v --remove-orphans >/dev/null 2>&1 || true' EXIT
t0=$(date +%s)
compose up --build -d
python - "127.0.0.1:$SLOSERVE_GATEWAY_PORT" <<'PY'
import sys, time
from sloserve.services.rpc import wait_healthy
wait_healthy(sys.argv[1], "", timeout=180)
PY
t_up=$(date +%s)
sloserve_bench() { python -m sloserve.services.cli bench "$@"; }
sloserve_bench --target "127.0.0.1:$SLOSERVE_GATEWAY_PORT" --trace sharegpt --qps 5 \
  --num-requests "$requests" --seed 0 --disable-tqdm --goodput ttft:1000 tpot:150 \
  --result-file "$result"
t_bench=$(date +%s)
# the OpenAI API too: one chat through the official client, with the API key
python - "http://127.0.0.1:$SLOSERVE_HTTP_PORT/v1" <<'PY'
import os, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key=os.environ["SLOSERVE_API_KEY"], max_retries=0)
r = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4,
                                   messages=[{"role": "user", "content": "hi"}])
assert r.usage is not None and r.usage.completion_tokens == 4, r
print(f"smoke: openai chat ok, usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}")
PY
python - "$result" "$requests" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
done, want = rows[-1].get("completed"), int(sys.argv[2])
print(f"smoke: completed {done}/{want}")
sys.exit(0 if done == want else 1)
PY
echo "smoke: up+build $((t_up - t0)) s, bench $((t_bench - t_up)) s, result $result"
