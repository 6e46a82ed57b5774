#!/usr/bin/env bash
# Every benchmark's quick mode, one after the other; nothing is written to docs/.
#
#   bash benchmarks/run_all.sh              # all of them (≈ 10-15 min on 2 cores)
#   bash benchmarks/run_all.sh guard floor  # only those whose name contains a word given
#
# Each benchmark's output goes to $OUT (default: a new temporary directory) as NAME.log; the
# summary at the end gives each one's exit status (bench_proc exits 1 when its target is
# missed: read the log), seconds and the load average before it; the exit status is 1 when one
# exited non-zero. Needs what the benchmarks need: the [bench] extra
# (cedarpy, casbin, regopy), bwrap, a running dockerd with the sandbox image (bench_docker,
# bench_mcp), and the loopback Redis and PostgreSQL of scripts/lib/redis.sh and postgres.sh
# (bench_replicas; 127.0.0.1:16379 and :15432 by default).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d -t pe-bench-XXXXXX)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the loopback servers of scripts/lib/redis.sh and postgres.sh, unless the caller names others
export POLICY_ENGINE_TEST_REDIS_URL="${POLICY_ENGINE_TEST_REDIS_URL:-redis://127.0.0.1:16379/0}"
export POLICY_ENGINE_TEST_PG_DSN="${POLICY_ENGINE_TEST_PG_DSN:-postgresql://postgres@127.0.0.1:15432/postgres}"

BENCHES=(
  "guard|benchmarks/bench_guard.py --quick"
  "new_grant|benchmarks/bench_new_grant.py --quick"
  "peer_ops|benchmarks/bench_peer_ops.py --quick"
  "scale|benchmarks/bench_scale.py --quick"
  "cold_start|benchmarks/bench_cold_start.py --quick"
  "authoring|benchmarks/bench_authoring.py --files 100 --repeat 1 --corpus $OUT/corpus"
  "mask_planning|benchmarks/mask_planning.py --rounds 3"
  "proc|benchmarks/bench_proc.py --quick --no-docs"
  "exec_start|benchmarks/bench_exec_start.py --n 500"
  "cgroup_reads|benchmarks/bench_cgroup_reads.py -n 200"
  "docker|benchmarks/bench_docker.py --runs 3"
  "http|benchmarks/bench_http.py --iterations 300"
  "meters|benchmarks/bench_meters.py --n 300"
  "floor|benchmarks/bench_floor.py --quick"
  "service|benchmarks/bench_service.py --seconds 1 --connections 8"
  "replicas|benchmarks/bench_replicas.py --quick"
  # shell.run is left out: the MCP fixture's exec is refused on this base (cwd not readable),
  # as tests/integration/test_mcp_http.py's exec tests are
  "mcp|benchmarks/bench_mcp.py --calls 20 --exec-calls 0"
)

wanted() {
  [ "$#" -eq 1 ] && return 0
  local name=$1; shift
  for word in "$@"; do [[ $name == *"$word"* ]] && return 0; done
  return 1
}

failed=0
summary=()
for entry in "${BENCHES[@]}"; do
  name=${entry%%|*}
  command=${entry#*|}
  wanted "$name" "$@" || continue
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "== $name: python3 $command (load $load)"
  start=$(date +%s)
  # shellcheck disable=SC2086  # the command's words split on purpose
  if python3 $command >"$OUT/$name.log" 2>&1; then
    status=ok
  else
    status="exit $?"
    failed=1
  fi
  took=$(( $(date +%s) - start ))
  tail -n 12 "$OUT/$name.log"
  summary+=("$(printf '%-14s %-16s %4ss  load before: %s' "$name" "$status" "$took" "$load")")
done

echo
echo "== summary (logs in $OUT)"
printf '%s\n' "${summary[@]}"
exit $failed
