#!/usr/bin/env bash
# The main job on the embedded defaults (SQLite budgets, JSONL evidence under ./var):
# install the engine, check the example org policy, explain requests (dry runs), run real
# operations in the sandbox and summarize the evidence they left.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/system-deps.sh
ensure_system_packages
python3 -m pip install --quiet --disable-pip-version-check .
export POLICY_ENGINE_STATE="${POLICY_ENGINE_STATE:-$PWD/var}"
mkdir -p "$POLICY_ENGINE_STATE"
# The example policy, manifests and grants are written for an agent workspace at /workspace.
mkdir -p /workspace
cp -rn examples/workspace/. /workspace/

ex=examples
policy=(--policy "$ex/policies/org.sbpolicy")
shell=(--manifest "$ex/manifests/shell.json" --grant "$ex/grants/shell-agent.json")

echo "== policy-engine check $ex/policies/*.sbpolicy"
policy-engine check "$ex"/policies/*.sbpolicy
echo; echo "== policy-engine lint --deny-warnings $ex/policies"
policy-engine lint --deny-warnings "$ex/policies"
echo; echo "== policy-engine test $ex/policies --coverage --threshold 100"
policy-engine test "$ex/policies" --coverage --threshold 100

for req in read-workspace-file read-private-key git-push metadata-decimal; do
  echo; echo "== policy-engine explain --request $ex/requests/$req.json"
  policy-engine explain "${policy[@]}" --request "$ex/requests/$req.json"
done

echo; echo "== policy-engine run: fs.read /workspace/src/app.py"
policy-engine run "${policy[@]}" --request "$ex/requests/read-workspace-file.json" "${shell[@]}"
echo; echo "== policy-engine run -- git --version   (proc.exec in bubblewrap + Landlock + seccomp)"
policy-engine run "${policy[@]}" "${shell[@]}" -- git --version
echo; echo "== policy-engine run -- git push origin main   (refused; evidence still written)"
policy-engine run "${policy[@]}" "${shell[@]}" -- git push origin main || true

echo; echo "== policy-engine stats $POLICY_ENGINE_STATE/evidence/evidence.jsonl"
policy-engine stats "$POLICY_ENGINE_STATE/evidence/evidence.jsonl"
