#!/usr/bin/env bash
# The workspace's tests (`cargo test --release --workspace`), with the cluster of e2e/cluster/up.sh up, in two
# streams at once:
# - the e2e files that use the cluster (chaos, chart, cli, cluster, python, scale), one at a time: they spend
#   most of their time waiting on it (probes, restarts, pods starting);
# - the rest, which compute (training, kernels, the roles as local processes) or run against API servers of
#   their own (e2e/apiserver), then the doctests.
# Side by side they take about the time of the longer. The executables of one `cargo test --workspace --no-run`
# are run directly: a `cargo test -p …` of part of the workspace would resolve other features and build it all
# again. Each stream runs all its executables, then fails if any failed; the cluster stream's output follows
# the other's.
#
#   bash e2e/run-tests.sh         # both streams (what .ci/run ends with)
#   bash e2e/run-tests.sh LIST    # the executables in file LIST ("package folder<TAB>executable" lines)
set -euo pipefail
cd "$(dirname "$0")/.."

# Runs the test executables listed on stdin one after another, each in its package's folder as cargo does.
run_tests() {
  local dir exe failed=()
  while IFS=$'\t' read -r dir exe; do
    echo "     Running $exe"
    (cd "$dir" && "$exe" </dev/null) || failed+=("$exe")
  done
  ((${#failed[@]} == 0)) || { echo "run-tests.sh: failed: ${failed[*]}" >&2; return 1; }
}
if (($#)); then
  run_tests <"$1"
  exit
fi

logs="$(mktemp -d)"
stream=""
# The cluster stream runs in a session of its own, so that an early exit stops its tests' processes too.
cleanup() {
  [[ -z "$stream" ]] || kill -- "-$stream" 2>/dev/null || true
  rm -rf "$logs"
}
trap cleanup EXIT
cargo test --release --workspace --no-run --message-format=json-render-diagnostics >"$logs/tests.json"
jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test)
  | "\(.manifest_path | rtrimstr("/Cargo.toml"))\t\(.executable)"' "$logs/tests.json" | sort >"$logs/tests"
[[ -s "$logs/tests" ]] || { echo "run-tests.sh: the build listed no test executable" >&2; exit 1; }
on_cluster=$'/e2e\t.*/deps/(chaos|chart|cli|cluster|python|scale)-[0-9a-f]+$'
grep -E "$on_cluster" "$logs/tests" >"$logs/cluster.list"
grep -vE "$on_cluster" "$logs/tests" >"$logs/rest.list"
setsid bash "$0" "$logs/cluster.list" >"$logs/cluster.log" 2>&1 &
stream=$!
status=0
run_tests <"$logs/rest.list" || status=$?
cargo test --release --workspace --doc || status=$?
wait "$stream" || status=$?
stream=""
cat "$logs/cluster.log"
exit "$status"
