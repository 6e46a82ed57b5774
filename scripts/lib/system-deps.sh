#!/usr/bin/env bash
# Debian packages the project needs at run/test time, installed only when missing.
# bubblewrap: proc sandbox; gcc + libc6-dev: the native sandbox launcher (musl-tools: built on
# musl, whose start skips glibc's CPUID probes, ~0.5 ms per sandboxed call on a VM); python3-dev: the
# headers `pip install` builds the guard's native openat2 probe with; python3 (Debian's
# /usr/bin/python3): the in-sandbox network bridge and the docker image's interpreter;
# docker.io: docker backend; chromium + fonts: browser backend; curl and git: tools the
# examples and sandbox tests run. Arguments: more packages (scripts/test.sh adds bindfs, a
# FUSE tree for the mask planner's tests: a file system whose changes reach no inotify watch)
SYSTEM_PACKAGES=(bubblewrap gcc libc6-dev musl-tools python3 python3-dev docker.io chromium fonts-dejavu-core curl git)

ensure_system_packages() {
  local missing=()
  for pkg in "${SYSTEM_PACKAGES[@]}" "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}
