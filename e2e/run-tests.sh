#!/usr/bin/env bash
# The workspace's tests (`cargo test --release --workspace`) in streams that run side by side:
# - host: the e2e files that drive the local node's own processes (chaos restarts its kubelet and API server;
#   scale fakes 48 hosts with its kwok), then python and kueue, on the cluster of e2e/cluster/up.sh;
# - kind: the e2e files that need several nodes (nodes: placement, a node lost, a drain; cluster: NetworkPolicy
#   across nodes), the CLI's (chart, cli) and sharing (preemption on a pool of 2 CS-2s, whose job runs long
#   enough to be preempted mid-run; on the local node's pool of 1 it ends first), on the kind cluster whose
#   kubeconfig WS_KIND_KUBECONFIG names (e2e/kind/up.sh); without one they join the host stream, but nodes,
#   which cannot run on one node. The two cluster streams take about as long (~45 min each in CI);
# - rest: everything else, which computes (training, kernels, the roles as local processes) or runs against API
#   servers of its own (e2e/apiserver), then the doctests. The executables of e2e/ and operator/, the only ones
#   that start API servers of their own, run first; those API servers are then stopped, so that they do not
#   take CPU from the other streams for the rest of the run.
# The cluster streams spend most of their time waiting on their cluster (probes, restarts, pods starting), one
# test file at a time; side by side the streams take about the time of the longest. The executables of one
# `cargo test --workspace --no-run` are run directly: a `cargo test -p …` of part of the workspace would resolve
# other features and build it all again. Each stream runs all its executables, then fails if any failed.
#
#   bash e2e/run-tests.sh                 # every stream side by side, their outputs one after another
#   bash e2e/run-tests.sh lists DIR       # build, and write DIR/{host,kind,rest}.list (.ci/run starts each)
#   bash e2e/run-tests.sh STREAM DIR      # one stream (host, kind or rest) of those lists
#   bash e2e/run-tests.sh start STREAM DIR [VAR=VALUE…]   # that stream in the background, in a session of its own
#   bash e2e/run-tests.sh wait DIR [STREAM…]              # until those (else every started one) end; without
#                                                         # names, then print every log and fail if one failed
#   bash e2e/run-tests.sh LIST            # the executables in file LIST ("package folder<TAB>executable" lines)
#   bash e2e/run-tests.sh apiservers-down # stops every API server the tests started (e2e/apiserver instances)
set -euo pipefail
cd "$(dirname "$0")/.."

# Runs the test executables listed on stdin one after another, each in its package's folder as cargo does, and
# says what each took: its wall time and the CPU of its own processes (not of the cluster's pods), the figures
# that say where CI's time goes on 2 cores.
run_tests() {
  local dir exe failed=() TIMEFORMAT
  while IFS=$'\t' read -r dir exe; do
    echo "     Running $exe"
    TIMEFORMAT="run-tests.sh: ${exe##*/}: %0R s wall, %0U s user + %0S s sys CPU"
    time (cd "$dir" && "$exe" </dev/null) || failed+=("$exe")
  done
  ((${#failed[@]} == 0)) || { echo "run-tests.sh: failed: ${failed[*]}" >&2; return 1; }
}

# Stops every instance of e2e/apiserver the tests started (default, restart, nodes, shared-cluster, …: one
# folder each under run/), keeping their data.
apiservers_down() {
  local run="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}/run" i
  for i in "$run"/*/; do
    [[ -f "$i/kube-apiserver.pid" || -f "$i/etcd.pid" ]] || continue
    WS_APISERVER_INSTANCE="$(basename "$i")" bash e2e/apiserver/down.sh || true
  done
}

# lists DIR: the stream each test executable belongs to.
lists() {
  local dir="$1" all="$1/tests.json" kind host
  mkdir -p "$dir"
  cargo test --release --workspace --no-run --message-format=json-render-diagnostics >"$all"
  jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test)
    | "\(.manifest_path | rtrimstr("/Cargo.toml"))\t\(.executable)"' "$all" | sort >"$dir/tests"
  [[ -s "$dir/tests" ]] || { echo "run-tests.sh: the build listed no test executable" >&2; return 1; }
  kind=$'/e2e\t.*/deps/(chart|cli|cluster|nodes|sharing)-[0-9a-f]+$'
  host=$'/e2e\t.*/deps/(chaos|python|scale|kueue)-[0-9a-f]+$'
  # The host stream in this order: Kueue last, so that its controller is not running beside the others' and
  # its build (.ci/run starts it in the background) has the whole stream's time.
  local f
  : >"$dir/host.list"
  for f in chaos python scale kueue; do
    grep -E $'/e2e\t.*/deps/'"$f"'-[0-9a-f]+$' "$dir/tests" >>"$dir/host.list" || true
  done
  grep -E "$kind" "$dir/tests" >"$dir/kind.list"
  grep -vE "$host|$kind" "$dir/tests" >"$dir/rest.list"
}

# stream NAME DIR
stream() {
  local name="$1" dir="$2" status=0
  case "$name" in
    host) run_tests <"$dir/host.list" ;;
    kind)
      [[ -s "$dir/kind.list" ]] || return 0
      [[ -n "${WS_KIND_KUBECONFIG:-}" ]] || { echo "run-tests.sh: WS_KIND_KUBECONFIG is not set" >&2; return 1; }
      KUBECONFIG="$WS_KIND_KUBECONFIG" run_tests <"$dir/kind.list"
      ;;
    rest)
      local own=$'^[^\t]*/(e2e|operator)\t'
      grep -E "$own" "$dir/rest.list" | run_tests || status=$?
      apiservers_down >/dev/null 2>&1
      grep -vE "$own" "$dir/rest.list" | run_tests || status=$?
      cargo test --release --workspace --doc || status=$?
      return "$status"
      ;;
    *) echo "run-tests.sh: no stream '$name' (host, kind, rest)" >&2; return 2 ;;
  esac
}

# start NAME DIR [VAR=VALUE…]: stream NAME in a session of its own (an early stop kills its tests' processes
# too), its output in DIR/NAME.log, its exit status in DIR/NAME.status once it ends, its session in DIR/NAME.pid.
start() {
  local name="$1" dir="$2"
  shift 2
  rm -f "$dir/$name.status"
  setsid env "$@" bash -c 'bash "$0" "$1" "$2" >"$2/$1.log" 2>&1; echo $? >"$2/$1.status"' "$0" "$name" "$dir" &
  echo $! >"$dir/$name.pid"
}

# wait_for DIR [NAME…]: until each named stream (else every started one) has ended, for WS_TESTS_MINUTES (150)
# at most; fails if one failed or did not end in time. With no names, prints every started stream's log first.
wait_for() {
  local dir="$1" name status=0 deadline=$((SECONDS + 60 * ${WS_TESTS_MINUTES:-150}))
  shift
  local names=("$@")
  if ((${#names[@]} == 0)); then
    for name in rest host kind; do [[ -f "$dir/$name.pid" || -f "$dir/$name.status" ]] && names+=("$name"); done
  fi
  for name in "${names[@]}"; do
    while [[ ! -s "$dir/$name.status" ]] && ((SECONDS < deadline)); do sleep 5; done
    [[ -s "$dir/$name.status" ]] || { echo "run-tests.sh: stream $name still running after the deadline" >&2; status=1; }
    [[ "$(cat "$dir/$name.status" 2>/dev/null)" == 0 ]] || status=1
  done
  if (($# == 0)); then
    for name in "${names[@]}"; do
      echo "===== e2e/run-tests.sh $name"
      cat "$dir/$name.log" 2>/dev/null || true
    done
    # Last, each failed test's panic and the lines after it, so that the end of a long output says why.
    for name in "${names[@]}"; do
      grep -q "panicked at" "$dir/$name.log" 2>/dev/null || continue
      echo "===== e2e/run-tests.sh $name: the failures"
      grep -A6 "panicked at" "$dir/$name.log" | grep -v "^stack backtrace:\|^ *[0-9]*: \|^ *at " | head -80
    done
  fi
  return "$status"
}

case "${1:-}" in
  lists) lists "$2"; exit ;;
  apiservers-down) apiservers_down; exit ;;
  start) start "${@:2}"; exit ;;
  wait) wait_for "${@:2}"; exit ;;
  host | kind | rest) stream "$1" "$2"; exit ;;
  "") ;;
  *) run_tests <"$1"; exit ;;
esac

dir="$(mktemp -d)"
# The streams' sessions go with this script, should it end first.
cleanup() {
  local pid
  for pid in "$dir"/*.pid; do [[ -f "$pid" ]] && { kill -- "-$(cat "$pid")" 2>/dev/null || true; }; done
  rm -rf "$dir"
}
trap cleanup EXIT
lists "$dir"
# Without a kind cluster, its files run on the local node, but the multi-node ones.
if [[ -z "${WS_KIND_KUBECONFIG:-}" ]]; then
  grep -vE $'/deps/nodes-[0-9a-f]+$' "$dir/kind.list" >>"$dir/host.list" || true
  echo "run-tests.sh: e2e/tests/nodes.rs needs several nodes: it runs with WS_KIND_KUBECONFIG (bash e2e/kind/up.sh)" >&2
  : >"$dir/kind.list"
fi
for s in rest host kind; do start "$s" "$dir"; done
wait_for "$dir"
