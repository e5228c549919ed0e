# Sourced by the bench scripts: starts a release kumo-server on $port in a
# scratch directory, on SQLite or (with a URL as $1) in a fresh schema of
# that PostgreSQL; sets $bin (the release binaries), $pid, $work, $label,
# $T (the admin token) and $S (its URL); removes everything on exit.
bin="${CARGO_TARGET_DIR:-target}/release"
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
args=(--listen 127.0.0.1:$port --data-dir "$work/data")
label=sqlite
if [ $# -ge 1 ]; then
  schema=kumo_bench_$$
  psql "$1" -qc "CREATE SCHEMA $schema"
  trap 'kill $pid 2>/dev/null || true; psql "$1" -qc "SET client_min_messages=warning; DROP SCHEMA $schema CASCADE"; rm -rf "$work"' EXIT
  sep='?'; [[ $1 == *\?* ]] && sep='&'
  database_url="$1${sep}options[search_path]=$schema"
  args+=(--database-url "$database_url")
  label=postgres
fi
KUMO_LOG=warn "$bin"/kumo-server serve "${args[@]}" >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$work/data/admin-token" ] && curl -sf localhost:$port/readyz >/dev/null && break; sleep 0.2; done
T=$(cat "$work/data/admin-token")
S=http://127.0.0.1:$port
