#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian 12 machine, start what it needs,
# then run ruff, mypy --strict and the whole pytest suite. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/system-deps.sh
ensure_system_packages bindfs
python3 -m pip install --quiet --disable-pip-version-check -e ".[test,bench]"
# the plain-install test (tests/integration/test_plain_install.py) installs the wheel's base
# dependencies and the serve/mcp extras into a fresh virtualenv from this local wheelhouse, so
# the test itself reaches no registry
export PE_WHEELHOUSE="$PWD/var/wheelhouse"
mkdir -p var
python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; x = p["optional-dependencies"]; print("\n".join(p["dependencies"] + x["serve"] + x["mcp"]))' > var/wheelhouse.txt
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  -d "$PE_WHEELHOUSE" -r var/wheelhouse.txt
# Bytecode, written once beside the set-up: with PYTHONDONTWRITEBYTECODE set (this image's shell
# sets it, as many CI images do) no process writes a .pyc, so on a fresh checkout every CLI the
# suite starts compiles its ~100-230 modules from source (0.1-0.5 s of CPU each time) and each
# worker rewrites every test file's asserts again (about 10 s of CPU). Reading them needs no
# write; the suite's own processes still write none. (syrupy off: a collection alone would call
# every snapshot unused and exit 1.)
echo "== bytecode, stale temporary trees (in the background)"
# Earlier runs' base temporary directories: the allowReadOutside tests' mask planning walks
# every directory on the host, these included (about 21,000 a run; docs/testing.md). pytest
# keeps the last one (tmp_path_retention_count), and a killed run's (a timeout, a lost session:
# its .lock names a dead pid) for three days. Every tree whose run has ended is removed here,
# without crossing into anything mounted in it; a running session's (its pid alive) is kept.
stale_temp_runs() {
  local root dir pid
  root="$(python3 -c 'import getpass, tempfile; print(f"{tempfile.gettempdir()}/pytest-of-{getpass.getuser()}")')"
  for dir in "$root"/pytest-[0-9]*/; do
    [ -d "$dir" ] || continue
    pid="$(head -c 16 "$dir/.lock" 2>/dev/null || true)"
    case "$pid" in *[!0-9]*) continue ;; esac
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    # no lock: an ended run, or one that started a moment ago and is about to write it
    if [ -z "$pid" ] && [ -z "$(find "$dir" -maxdepth 0 -mmin +2)" ]; then continue; fi
    rm -rf --one-file-system "$dir" || true
  done
}
(stale_temp_runs; env -u PYTHONDONTWRITEBYTECODE python3 -m compileall -q -j 0 policy_engine plugins \
   && env -u PYTHONDONTWRITEBYTECODE python3 -m pytest -q -p no:cacheprovider -p no:syrupy \
        --collect-only "$@") > var/bytecode.log 2>&1 &
bytecode_pid=$!
echo "== ruff"; python3 -m ruff check policy_engine plugins tests benchmarks conformance
# mypy --strict takes a core for a minute or two: it runs beside the set-up and the suite (most
# of which waits on child processes) and its verdict is printed, and counted, after the suite
echo "== mypy --strict (in the background; its report follows the suite's)"
python3 -m mypy > var/mypy.log 2>&1 &
mypy_pid=$!
source scripts/lib/dockerd.sh; ensure_dockerd; bash scripts/build-images.sh
# gVisor (runsc) as a second OCI runtime of dockerd: the docker executor's high isolation
source scripts/lib/runsc.sh; ensure_runsc
# the shared-state plugins (issue 18) run against real servers on loopback
source scripts/lib/redis.sh; ensure_redis
source scripts/lib/postgres.sh; ensure_postgres
# most tests wait on child processes, sandboxes, containers and servers: three workers on two
# cores fill what two leave idle; a file's tests stay together on one worker (tests/conftest.py,
# docs/testing.md "In parallel")
wait "$bytecode_pid" || echo "(warming the bytecode failed: var/bytecode.log; the suite compiles as it goes)"
echo "== pytest"; tests=0
python3 -m pytest -q -p no:cacheprovider -n "${PE_TEST_WORKERS:-3}" \
  --dist loadgroup --no-loadscope-reorder --durations=30 "$@" || tests=$?
echo "== mypy --strict"; typed=0; wait "$mypy_pid" || typed=$?; cat var/mypy.log
if [ "$tests" -ne 0 ]; then exit "$tests"; fi
exit "$typed"
