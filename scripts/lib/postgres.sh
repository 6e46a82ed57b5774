#!/usr/bin/env bash
# Start a throw-away PostgreSQL cluster on loopback for the tests (initdb in a temp dir, run as
# the `postgres` user, trust auth on 127.0.0.1 only) unless POLICY_ENGINE_TEST_PG_DSN already
# names one; installs the Debian package when missing.
# Usage: source scripts/lib/postgres.sh; ensure_postgres   (exports POLICY_ENGINE_TEST_PG_DSN)

PG_TEST_PORT="${PG_TEST_PORT:-15432}"
PG_WAIT_S="${PG_WAIT_S:-30}"

_pg_bin() {
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$dir" ] && echo "$dir"
}

ensure_postgres() {
  if [ -n "${POLICY_ENGINE_TEST_PG_DSN:-}" ]; then
    return 0
  fi
  if [ -z "$(_pg_bin)" ]; then
    echo "== installing Debian package postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  fi
  local bin dsn
  bin="$(_pg_bin)"
  dsn="postgresql://postgres@127.0.0.1:${PG_TEST_PORT}/postgres"
  if ! "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_TEST_PORT"; then
    local dir
    dir="$(mktemp -d /tmp/policy-engine-pg.XXXXXX)"
    # initdb and postgres refuse to run as root: as root, run them as Debian's `postgres` user
    local as=()
    if [ "$(id -u)" = 0 ]; then
      chown postgres: "$dir"
      as=(runuser -u postgres --)
    fi
    echo "== starting postgres on 127.0.0.1:${PG_TEST_PORT} (cluster: $dir/data)"
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust \
      -E UTF8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
    # fsync off: a test cluster, thrown away with the machine; sockets in the temp dir
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w \
      -t "$PG_WAIT_S" -o "-c listen_addresses=127.0.0.1 -p $PG_TEST_PORT \
      -c unix_socket_directories=$dir -c fsync=off -c max_connections=200" start \
      >/dev/null || { tail -n 20 "$dir/postgres.log" >&2; return 1; }
  fi
  export POLICY_ENGINE_TEST_PG_DSN="$dsn"
}
