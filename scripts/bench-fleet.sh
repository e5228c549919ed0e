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
"$bin"/kumo-load --url $S --token "$T" fleet --hosts "${HOSTS:-2000}" \
  --seconds "${SECONDS_:-120}" --warmup-secs "${WARMUP:-30}" --change-rate "${CHANGES:-20}" --read-rate "${READS:-100}" \
  --server-pid $pid --database "$db"
