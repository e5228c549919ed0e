#!/usr/bin/env bash
# Writes a release's upgrade fixture: a small database made by that
# release's own binaries (its migrations, its API, its simulated fleet) with
# representative rows, once on SQLite and once on PostgreSQL.
#
#   scripts/write-upgrade-fixture.sh VERSION BIN_DIR [COMMIT]
#
# BIN_DIR holds that release's `kumo-server` and `kumo`, built from COMMIT
# [default: HEAD] (the rolling-upgrade test builds it again from there). The fixture goes to
# tests/fixtures/upgrade/VERSION/: kumo.db (SQLite), postgres.sql (pg_dump,
# plain SQL) and expect.json (names the upgrade test looks for through the
# API). Run it when a release is cut, from that release's checkout; a
# release's fixture is never rewritten (tests/tests/api/upgrade.rs).
set -euo pipefail
version=${1:?usage: $0 VERSION BIN_DIR}
bin=$(cd "${2:?usage: $0 VERSION BIN_DIR}" && pwd)
cd "$(dirname "$0")/.."
out=tests/fixtures/upgrade/$version
mkdir -p "$out"
commit=$(git rev-parse "${3:-HEAD}")
pg=${KUMO_FIXTURE_PG:-postgres://127.0.0.1:5432}
pgdb=kumo_fixture_${version//[^0-9a-z]/_}

kumo() { "$bin/kumo" "$@"; }
has() { "$bin/kumo" "$@" --help >/dev/null 2>&1; }

# One release's representative use: users, a project with members, quota,
# points and a rate card, segments, VMs (GPU, CPU-only spot, stopped,
# deleted), a cluster, a drained host, a join token, metering; and, where
# the release has them, volumes, public addresses and forwards, idle
# policies.
scenario() {
  kumo user create alice --display-name "Alice Sato" --email alice@example.org
  kumo user create ci-bot --service
  kumo tenant create lab --display-name "Vision lab" --description "fixture project"
  kumo member add alice --tenant lab --role owner
  kumo member add ci-bot --tenant lab --role member
  kumo token create --user alice --description laptop --expires-in 90d >/dev/null
  kumo quota set --tenant lab --gpus H100-SXM5-80GB=16 --gpus A100-SXM4-40GB=8 \
    --vcpus 512 --memory-gib 4096 --vms 20 --segments 4 --public-ips 2
  # Limits later releases added.
  for limit in "--roce-segments 2" "--disk-gib 2000" "--volume-gib 500"; do
    if kumo quota set --help | grep -q -- "${limit%% *}"; then
      kumo quota set --tenant lab $limit >/dev/null
    fi
  done
  kumo points grant --tenant lab --amount 100000 --expires 2099-12-31 --note "fixture grant"
  kumo segment create lab-net --tenant lab --cidr 10.1.0.0/24 --allow tcp:22:0.0.0.0/0
  kumo segment create lab-roce --tenant lab --kind roce --cidr 10.2.0.0/24
  kumo vm create train --tenant lab --gpus 8 --gpu-model H100-SXM5-80GB --network lab-net --wait
  kumo vm create notebook --tenant lab --gpus 1 --gpu-model A100-SXM4-40GB --spot --wait
  kumo vm create cpu-box --tenant lab --vcpus 4 --memory 8 --wait
  kumo vm stop cpu-box --tenant lab
  kumo vm create scratch --tenant lab --vcpus 2 --memory 4 --wait
  kumo vm delete scratch --tenant lab
  kumo cluster create ddp --tenant lab --size 2 --gpus 1 --gpu-model A100-SXM4-40GB
  kumo host join-token create --description "rack 7" >/dev/null
  if has volume; then
    kumo volume create data --tenant lab --size-gib 100 --vm train
    kumo volume attach data --tenant lab --vm train
  fi
  if has public-ip && [ -n "${pool:-}" ]; then
    address=$(kumo -o json public-ip allocate --tenant lab --pool "$pool" | jq -r .address)
    kumo public-ip attach "$address" --tenant lab --vm train
    shared=$(kumo -o json public-ip allocate --tenant lab --pool "$pool" | jq -r .address)
    kumo port-forward create --tenant lab --public "$shared:2222/tcp" --to train:22
  fi
  if has idle; then
    kumo idle set-policy --tenant lab --utilization-pct 10 --hours 12
    kumo idle exempt train --tenant lab --reason "fixture: long training run" --days 7
  fi
  # Metering posts every minute: wait for charges to be in the ledger.
  sleep 70
  kumo points show --tenant lab
}

run_one() {
  local backend=$1 data url port
  data=$(mktemp -d)
  if [ "$backend" = postgres ]; then
    psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $pgdb" -c "CREATE DATABASE $pgdb"
    url=$pg/$pgdb
  else
    url="sqlite://$data/kumo.db?mode=rwc"
  fi
  export HOME=$data/home
  mkdir -p "$HOME"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin/kumo-server" dev --data-dir "$data" --database-url "$url" \
    --listen "127.0.0.1:$port" --hosts 5 --log-format text >"$data/server.log" 2>&1 &
  server=$!
  trap 'kill -TERM "$server" 2>/dev/null || true' EXIT
  for _ in $(seq 1 120); do
    kill -0 "$server" 2>/dev/null || { cat "$data/server.log" >&2; exit 1; }
    [ -s "$data/admin-token" ] && curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
    sleep 1
  done
  kumo login --server "http://127.0.0.1:$port" --token "$(cat "$data/admin-token")"
  # Every simulated host registered and ready before the scenario.
  for _ in $(seq 1 120); do
    ready=$(curl -sf -H "Authorization: Bearer $(cat "$data/admin-token")" \
      "http://127.0.0.1:$port/api/v1/hosts?limit=100" |
      jq '(.items // .) | map(select(.state == "ready")) | length')
    [ "${ready:-0}" -ge 5 ] && break
    sleep 1
  done
  # The simulated fleet's provider network, where a release has one.
  pool=
  if [ -f "$data/fleet/network.json" ]; then
    pool=$(jq -r '.pool.name // empty' "$data/fleet/network.json")
  fi
  scenario
  kill -TERM "$server"
  wait "$server" || true
  if [ "$backend" = postgres ]; then
    pg_dump --no-owner --no-privileges "$pg/$pgdb" >"$out/postgres.sql"
    psql "$pg/postgres" -qc "DROP DATABASE $pgdb"
  else
    # One file: fold the write-ahead log in first.
    python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); c.execute("PRAGMA journal_mode=DELETE"); c.execute("VACUUM"); c.close()' "$data/kumo.db"
    cp "$data/kumo.db" "$out/kumo.db"
  fi
  rm -rf "$data"
}

run_one sqlite
run_one postgres
# The release's migrations as released: they are never edited afterwards.
hashes=$(git ls-tree --name-only "$commit" migrations/src/ | grep '/m[0-9]*_.*\.rs$' | while read -r f; do
  printf '    "%s": "%s"' "$(basename "$f" .rs)" "$(git show "$commit:$f" | sha256sum | cut -d' ' -f1)"
  echo ,
done | sed '$ s/,$//')
cat >"$out/expect.json" <<EOF
{
  "version": "$version",
  "commit": "$commit",
  "tenants": ["demo", "lab"],
  "users": ["admin", "alice", "ci-bot"],
  "segments": ["lab-net", "lab-roce"],
  "vms": ["train", "notebook", "cpu-box", "ddp-0", "ddp-1"],
  "deleted_vms": ["scratch"],
  "stopped_vms": ["cpu-box"],
  "migrations": {
$hashes
  }
}
EOF
echo "fixture written to $out"
