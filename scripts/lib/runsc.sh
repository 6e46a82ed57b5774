#!/usr/bin/env bash
# gVisor for the docker executor: install Debian's runsc when missing and register it with dockerd
# as the OCI runtime `runsc`; idempotent (nothing is rewritten or reloaded when already so).
# Platform: ptrace. On this kind of machine (a Firecracker VM, kernel 6.18, Debian's runsc
# 0.0~20221219) `--platform=kvm` hangs while the sandbox boots and `systrap` does not exist in
# that version (docs/docker.md, "gVisor (runsc)"). `--network=none`: sandbox containers never
# have a network, and runsc's own netstack refuses docker's `--network=none` namespace.
# `--oci-seccomp`: the executor's seccomp profile is applied inside the sandbox too (runsc
# ignores it otherwise).
# Usage: source scripts/lib/dockerd.sh; ensure_dockerd; source scripts/lib/runsc.sh; ensure_runsc

RUNSC_PLATFORM="${RUNSC_PLATFORM:-ptrace}"
DOCKER_DAEMON_JSON="${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}"
RUNSC_WAIT_S="${RUNSC_WAIT_S:-30}"

_runsc_registered() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'
}

# Merge the runsc entry into daemon.json; prints "changed" when the file was (re)written.
_runsc_write_config() {
  python3 - "$DOCKER_DAEMON_JSON" "$RUNSC_PLATFORM" <<'PY'
import json, os, sys
path, platform = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        conf = json.load(f)
except FileNotFoundError:
    conf = {}
want = {"path": "/usr/bin/runsc",
        "runtimeArgs": [f"--platform={platform}", "--network=none", "--oci-seccomp", "--host-uds=open"]}
if conf.get("runtimes", {}).get("runsc") != want:
    conf.setdefault("runtimes", {})["runsc"] = want
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(conf, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print("changed")
PY
}

ensure_runsc() {
  if ! command -v runsc >/dev/null 2>&1; then
    echo "== installing runsc (gVisor) from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends runsc >/dev/null
  fi
  local changed
  changed="$(_runsc_write_config)"
  if [ -z "$changed" ] && _runsc_registered; then
    echo "== runsc registered with dockerd ($(runsc --version | head -n 1))"
    return 0
  fi
  # dockerd re-reads `runtimes` from its config file on SIGHUP (no restart, containers live on)
  local pid
  pid="$(cat /var/run/docker.pid 2>/dev/null || pgrep -xo dockerd || true)"
  if [ -z "$pid" ]; then
    echo "dockerd is not running: call ensure_dockerd first" >&2
    return 1
  fi
  kill -HUP "$pid"
  local waited=0
  until _runsc_registered; do
    if [ "$waited" -ge "$RUNSC_WAIT_S" ]; then
      echo "dockerd did not list the runsc runtime within ${RUNSC_WAIT_S}s after SIGHUP" >&2
      tail -n 20 "${DOCKERD_LOG:-/var/log/policy-engine-dockerd.log}" >&2 || true
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "== runsc registered with dockerd (platform $RUNSC_PLATFORM)"
}
