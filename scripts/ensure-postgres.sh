#!/usr/bin/env bash
# Makes PostgreSQL answer at 127.0.0.1:5432 with trust authentication for
# the current user and a database `test`, installing it from Debian when it
# is missing. Does nothing when a server already answers.
set -euo pipefail

answers() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
if answers; then exit 0; fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v pg_ctlcluster >/dev/null; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq postgresql
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
if [ -z "$version" ]; then
  echo "ensure-postgres: no PostgreSQL cluster found after installing" >&2
  exit 1
fi
hba=/etc/postgresql/$version/main/pg_hba.conf
# Loopback only, for the test database: the tests connect without a password.
if ! as_root grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
  as_root sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
fi
as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 30); do answers && break; sleep 1; done
answers || { echo "ensure-postgres: PostgreSQL did not start" >&2; exit 1; }
me=$(id -un)
as_root su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='$me'\"" | grep -q 1 \
  || as_root su postgres -c "psql -qc 'CREATE ROLE \"$me\" SUPERUSER LOGIN'"
as_root su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='test'\"" | grep -q 1 \
  || as_root su postgres -c "createdb -O '$me' test"
echo "ensure-postgres: PostgreSQL $version is up at 127.0.0.1:5432"
