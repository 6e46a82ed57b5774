#!/usr/bin/env bash
# Start a Docker Engine for the tests when none answers; idempotent, bounded wait.
# This machine: cgroup v1, no registry, no need for container networking (containers run with
# --network=none), so the daemon runs without iptables and without the default bridge.
# Usage: source scripts/lib/dockerd.sh; ensure_dockerd

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/policy-engine-dockerd.log}"
DOCKERD_WAIT_S="${DOCKERD_WAIT_S:-60}"

ensure_dockerd() {
  if docker info >/dev/null 2>&1; then
    return 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "dockerd not found: install the Debian package docker.io" >&2
    return 1
  fi
  echo "== starting dockerd (log: $DOCKERD_LOG)"
  local driver="overlay2"
  grep -qw overlay /proc/filesystems || driver="vfs"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  # setsid + nohup: the daemon outlives this shell; no iptables/bridge (nothing needs them)
  setsid nohup dockerd --iptables=false --ip-masq=false --bridge=none \
    --storage-driver="$driver" --exec-opt native.cgroupdriver=cgroupfs \
    >>"$DOCKERD_LOG" 2>&1 </dev/null &
  local waited=0
  until docker info >/dev/null 2>&1; do
    if [ "$waited" -ge "$DOCKERD_WAIT_S" ]; then
      echo "dockerd did not become ready within ${DOCKERD_WAIT_S}s; last log lines:" >&2
      tail -n 20 "$DOCKERD_LOG" >&2
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "== dockerd ready after ${waited}s (storage driver $driver)"
}
