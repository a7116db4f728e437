#!/usr/bin/env bash
# A Docker daemon of the suite's own for kind on this machine, started once and reused: Debian's docker.io
# (apt-get when missing), its socket, data and state under $WS_CACHE_DIR/docker, and e2e/kind/oci-runtime.sh as
# its default runtime, so `docker run --privileged` (how kind starts its nodes) works on a host whose capability
# bounding set lacks one (this machine lacks CAP_SYS_RESOURCE). It leaves iptables alone (`iptables: false`):
# the nodes talk over their own bridge, and the host's rules (the local cluster's kube-proxy and kube-router)
# stay as they are. Prints the DOCKER_HOST to use as its last line; `down` stops the daemon (its data is kept:
# images built once are not built again).
#
#   export DOCKER_HOST="$(bash e2e/kind/docker.sh | tail -n1)"     bash e2e/kind/docker.sh down
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=e2e/kind/common.sh
source "$HERE/common.sh"
D="$DOCKER_DIR"
SOCK="$DOCKER_SOCK"
answers() { DOCKER_HOST="unix://$SOCK" docker version >/dev/null 2>&1; }

if [[ "${1:-}" == down ]]; then
  [[ -f "$D/docker.pid" ]] || exit 0
  pid="$(cat "$D/docker.pid")"
  kill "$pid" 2>/dev/null || exit 0
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.2; done
  log "dockerd ($pid) still running 20 s after SIGTERM: killing it"
  kill -KILL "$pid" 2>/dev/null || true
  exit 0
fi

if ! answers; then
  if ! command -v dockerd >/dev/null || ! command -v jq >/dev/null; then
    [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null \
      || { log "dockerd and jq are needed (Debian: apt-get install docker.io jq), and this is not root on Debian"; exit 1; }
    log "installing docker.io and jq with apt-get"
    (exec 8>/tmp/weightstream-apt.lock && flock -w 900 8 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io jq) >&2
  fi
  mkdir -p "$D/data" "$D/exec"
  # The runtime is a copy, so a work tree moved or deleted later does not break the daemon's containers.
  install -m 0755 "$HERE/oci-runtime.sh" "$D/oci-runtime.sh"
  jq -n --arg d "$D" '{
    runtimes: {"ws-runc": {path: ($d + "/oci-runtime.sh")}}, "default-runtime": "ws-runc",
    iptables: false, "ip-masq": false, "storage-driver": "overlay2",
    "data-root": ($d + "/data"), "exec-root": ($d + "/exec"), pidfile: ($d + "/docker.pid"),
    hosts: [("unix://" + $d + "/docker.sock")], "log-driver": "json-file",
    "log-opts": {"max-size": "10m", "max-file": "2"}
  }' >"$D/daemon.json"
  log "starting dockerd (log: $D/dockerd.log)"
  setsid dockerd --config-file "$D/daemon.json" >>"$D/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 150); do answers && break; sleep 0.2; done
  answers || { log "dockerd did not answer on $SOCK within 30 s; the end of its log:"; tail -20 "$D/dockerd.log" >&2; exit 1; }
fi
echo "unix://$SOCK"
