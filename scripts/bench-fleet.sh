#!/usr/bin/env bash
# The fleet simulator against a release kumo-server (issue 39):
# `kumo-load fleet` registers HOSTS simulated hosts (HGX H100, DGX A100,
# L40S and CPU-only in turn) through the agent's own client, keeps each
# beating every 5 s, long-polling and reporting as `kumo-agent run` does,
# with GPU figures every 15 s, while a second load creates, stops, starts
# and deletes 8-GPU VMs and 2×8 clusters (CHANGES/s) and reads the API
# (READS/s) for SECONDS; prints one JSON object. Its figures leave out the
# first WARMUP seconds (every host's first beat carries its inventory, a
# burst no steady fleet sends); `whole_run` has them all.
#   scripts/bench-fleet.sh                      # SQLite (the embedded default)
#   scripts/bench-fleet.sh postgres://root@127.0.0.1:5432/test
# HOSTS (2000), SECONDS_ (120), CHANGES (20), READS (100), WARMUP (30) override.
# REPLICAS=2 (PostgreSQL only) starts a second server on the same database
# and puts HAProxy (Debian's) in front of both, every request balanced on
# its own; the server figures are then the two replicas' together.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p kumo-server -p kumo-tests --bin kumo-server --bin kumo-load
ulimit -n "$(ulimit -Hn)"
port=18093
source scripts/server-under-test.sh
# The database's growth: the SQLite file, or the whole PostgreSQL
# database the schema is in (its growth during the run).
db="$work/data/kumo.db"
if [ $# -ge 1 ]; then db="$1"; fi
pids=(--server-pid "$pid")
if [ "${REPLICAS:-1}" = 2 ]; then
  [ $# -ge 1 ] || { echo "REPLICAS=2 needs a PostgreSQL URL" >&2; exit 1; }
  # Replicas prove themselves to each other with one key.
  mkdir -p "$work/data2"
  cp "$work/data/replica.key" "$work/data2/"
  KUMO_LOG=warn "$bin"/kumo-server serve --listen 127.0.0.1:$((port + 1)) --data-dir "$work/data2" \
    --database-url "$database_url" >"$work/server2.log" 2>&1 &
  pid2=$!
  # From here the second server and HAProxy go too, however the run ends.
  trap 'kill $pid $pid2 $(cat "$work/haproxy.pid" 2>/dev/null) 2>/dev/null || true; psql "$1" -qc "SET client_min_messages=warning; DROP SCHEMA $schema CASCADE"; rm -rf "$work"' EXIT
  ready=
  for _ in $(seq 100); do curl -sf localhost:$((port + 1))/readyz >/dev/null && ready=1 && break; sleep 0.2; done
  [ -n "$ready" ] || { echo "the second replica did not start:" >&2; cat "$work/server2.log" >&2; exit 1; }
  cat >"$work/haproxy.cfg" <<CFG
global
  maxconn 9000
defaults
  maxconn 9000
  mode http
  option http-server-close
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend kumo
  bind 127.0.0.1:$((port + 2))
  default_backend replicas
backend replicas
  balance roundrobin
  server a 127.0.0.1:$port
  server b 127.0.0.1:$((port + 1))
CFG
  haproxy -f "$work/haproxy.cfg" -D -p "$work/haproxy.pid"
  S=http://127.0.0.1:$((port + 2))
  pids+=(--server-pid "$pid2")
fi
"$bin"/kumo-load --url $S --token "$T" fleet --hosts "${HOSTS:-2000}" \
  --seconds "${SECONDS_:-120}" --warmup-secs "${WARMUP:-30}" --change-rate "${CHANGES:-20}" --read-rate "${READS:-100}" \
  "${pids[@]}" --database "$db"
