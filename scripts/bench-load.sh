#!/usr/bin/env bash
# Open-loop load on a release kumo-server (issue 9's load figures):
# `kumo-load api`, 500 requests/s for 30 s, 80 % reads / 20 % writes, then
# the server's resident memory (now and at its peak). The fleet has its
# own script: scripts/bench-fleet.sh.
#   scripts/bench-load.sh                      # SQLite (the embedded default)
#   scripts/bench-load.sh postgres://root@127.0.0.1:5432/test
# RATE and SECONDS_ override the defaults.
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
