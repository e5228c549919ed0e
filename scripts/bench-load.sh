#!/usr/bin/env bash
# Open-loop load on a release kumo-server (issue 9's load figures):
#   1. `kumo-load api`: 500 requests/s for 30 s, 80 % reads / 20 % writes;
#   2. `kumo-load fleet`: 10,000 simulated hosts registered, then each
#      heart-beating every 30 s for 60 s;
# then the server's resident memory (now and at its peak).
#   scripts/bench-load.sh                      # SQLite (the embedded default)
#   scripts/bench-load.sh postgres://root@127.0.0.1:5432/test
# RATE, SECONDS_, HOSTS, HEARTBEAT and FLEET_SECONDS override the defaults.
# Generator and server share this machine's cores; figures go to
# BENCHMARKS.md and RELIABILITY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p kumo-server -p kumo-tests --bin kumo-server --bin kumo-load
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
port=18091
args=(--listen 127.0.0.1:$port --data-dir "$work/data")
label=sqlite
if [ $# -ge 1 ]; then
  schema=kumo_load_$$
  psql "$1" -qc "CREATE SCHEMA $schema"
  trap 'kill $pid 2>/dev/null || true; psql "$1" -qc "SET client_min_messages=warning; DROP SCHEMA $schema CASCADE"; rm -rf "$work"' EXIT
  sep='?'; [[ $1 == *\?* ]] && sep='&'
  args+=(--database-url "$1${sep}options[search_path]=$schema")
  label=postgres
fi
KUMO_LOG=warn target/release/kumo-server serve "${args[@]}" >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$work/data/admin-token" ] && curl -sf localhost:$port/readyz >/dev/null && break; sleep 0.2; done
T=$(cat "$work/data/admin-token")
S=http://127.0.0.1:$port
mem() { awk '/VmRSS|VmHWM/ {printf "%s %d MiB  ", $1, $2/1024}' /proc/$pid/status; echo; }
echo "== $label: server after start: $(mem)"
echo "== $label: api ${RATE:-500}/s for ${SECONDS_:-30} s"
target/release/kumo-load --url $S --token "$T" api --rate "${RATE:-500}" --seconds "${SECONDS_:-30}"
echo "== $label: server after the api run: $(mem)"
echo "== $label: fleet of ${HOSTS:-10000} hosts"
target/release/kumo-load --url $S --token "$T" fleet --hosts "${HOSTS:-10000}" \
  --heartbeat-secs "${HEARTBEAT:-30}" --seconds "${FLEET_SECONDS:-60}"
echo "== $label: server with the fleet: $(mem)"
