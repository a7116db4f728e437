#!/usr/bin/env bash
# A fault or a repair of one node of e2e/kind/up.sh's cluster, as a platform engineer meets them: the node's
# container paused (a hung host: every process frozen, nothing answers) or stopped (a host gone), and back.
#
#   bash e2e/kind/node.sh pause|unpause|stop|start NODE       (NODE: a node's name, e.g. weightstream-worker2)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=e2e/kind/common.sh
source "$HERE/common.sh"
action="${1:-}" node="${2:-}"
case "$action" in
  pause | unpause | stop | start) ;;
  *) log "usage: node.sh pause|unpause|stop|start NODE"; exit 2 ;;
esac
export DOCKER_HOST="unix://$DOCKER_SOCK"
# Only a node of this cluster: kind labels its containers with the cluster's name.
[[ -n "$node" ]] && docker ps -a --filter "label=io.x-k8s.kind.cluster=$CLUSTER" --format '{{.Names}}' | grep -qxF "$node" \
  || { log "no node '$node' in kind cluster $CLUSTER"; exit 1; }
log "$action $node"
docker "$action" "$node" >/dev/null
