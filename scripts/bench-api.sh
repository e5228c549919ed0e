#!/usr/bin/env bash
# API throughput and latency of a release kumo-server under wrk (closed
# loop, 8 connections, 10 s each): healthz, an authenticated tenant read by
# a viewer, and tenant creation (a write transaction with its audit entry).
#   scripts/bench-api.sh                      # SQLite (the embedded default)
#   scripts/bench-api.sh postgres://root@127.0.0.1:5432/test
# Client and server share this machine's cores; figures go to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
cargo build --release -q -p kumo-server
port=18090
source scripts/server-under-test.sh
post() { curl -sf -H "Authorization: Bearer $T" -H 'content-type: application/json' "$@"; }
post -d '{"name":"bench"}' $S/api/v1/tenants >/dev/null
post -d '{"name":"reader"}' $S/api/v1/users >/dev/null
post -X PUT -d '{"role":"viewer"}' $S/api/v1/tenants/bench/members/reader >/dev/null
RT=$(post -d '{}' $S/api/v1/users/reader/tokens | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])')
cat >"$work/post.lua" <<'LUA'
token = os.getenv("KUMO_BENCH_TOKEN")
counter = 0
request = function()
  counter = counter + 1
  local body = string.format('{"name":"t-%d-%d"}', math.random(1, 1000000000), counter)
  return wrk.format("POST", "/api/v1/tenants", {["Content-Type"]="application/json", ["Authorization"]="Bearer " .. token}, body)
end
LUA
show() { grep -E "Requests/sec|50%|99%|Non-2xx|errors"; }
echo "== $label: GET /healthz"; wrk -t1 -c8 -d10s --latency $S/healthz | show
echo "== $label: GET /api/v1/tenants/bench as viewer"; wrk -t1 -c8 -d10s --latency -H "Authorization: Bearer $RT" $S/api/v1/tenants/bench | show
echo "== $label: POST /api/v1/tenants as admin"; KUMO_BENCH_TOKEN=$T wrk -t1 -c8 -d10s --latency -s "$work/post.lua" $S | show
