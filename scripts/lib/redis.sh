#!/usr/bin/env bash
# Start a throw-away Redis on loopback for the tests (no persistence, data in a temp dir) unless
# POLICY_ENGINE_TEST_REDIS_URL already names one; installs the Debian package when missing.
# Usage: source scripts/lib/redis.sh; ensure_redis   (exports POLICY_ENGINE_TEST_REDIS_URL)

REDIS_TEST_PORT="${REDIS_TEST_PORT:-16379}"
REDIS_WAIT_S="${REDIS_WAIT_S:-20}"

ensure_redis() {
  if [ -n "${POLICY_ENGINE_TEST_REDIS_URL:-}" ]; then
    return 0
  fi
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "== installing Debian package redis-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  fi
  local url="redis://127.0.0.1:${REDIS_TEST_PORT}/0"
  if ! redis-cli -u "$url" ping >/dev/null 2>&1; then
    local dir
    dir="$(mktemp -d /tmp/policy-engine-redis.XXXXXX)"
    echo "== starting redis-server on 127.0.0.1:${REDIS_TEST_PORT} (dir: $dir)"
    # loopback only, no RDB snapshots, no AOF: test state dies with the server
    redis-server --bind 127.0.0.1 --port "$REDIS_TEST_PORT" --dir "$dir" --save "" \
      --appendonly no --daemonize yes --logfile "$dir/redis.log" --pidfile "$dir/redis.pid"
    local waited=0
    until redis-cli -u "$url" ping >/dev/null 2>&1; do
      if [ "$waited" -ge "$REDIS_WAIT_S" ]; then
        echo "redis-server did not answer within ${REDIS_WAIT_S}s" >&2
        tail -n 20 "$dir/redis.log" >&2
        return 1
      fi
      sleep 1
      waited=$((waited + 1))
    done
  fi
  export POLICY_ENGINE_TEST_REDIS_URL="$url"
}
