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
port=18091
source scripts/server-under-test.sh
mem() { awk '/VmRSS|VmHWM/ {printf "%s %d MiB  ", $1, $2/1024}' /proc/$pid/status; echo; }
echo "== $label: server after start: $(mem)"
echo "== $label: api ${RATE:-500}/s for ${SECONDS_:-30} s"
"$bin"/kumo-load --url $S --token "$T" api --rate "${RATE:-500}" --seconds "${SECONDS_:-30}"
echo "== $label: server after the api run: $(mem)"
echo "== $label: fleet of ${HOSTS:-10000} hosts"
"$bin"/kumo-load --url $S --token "$T" fleet --hosts "${HOSTS:-10000}" \
  --heartbeat-secs "${HEARTBEAT:-30}" --seconds "${FLEET_SECONDS:-60}"
echo "== $label: server with the fleet: $(mem)"
