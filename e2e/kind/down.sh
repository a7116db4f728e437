#!/usr/bin/env bash
# Removes what e2e/kind/up.sh made: the kind cluster's node containers and their volumes, the `kind` network, the
# kubeconfig and the folder of the cluster's storage volumes, then stops e2e/kind/docker.sh's daemon. The images stay cached (the next up.sh builds nothing).
# Checks that no container, network or volume of the cluster is left, and fails naming any that is.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=e2e/kind/common.sh
source "$HERE/common.sh"
[[ -S "$DOCKER_SOCK" ]] || { log "no Docker daemon of the suite's is running: nothing to remove"; exit 0; }
export DOCKER_HOST="unix://$DOCKER_SOCK"
KIND="$(ls "$CACHE"/bin/kind-v* 2>/dev/null | tail -n1 || true)"
volumes="$(docker ps -a --filter "label=io.x-k8s.kind.cluster=$CLUSTER" -q | xargs -r docker inspect \
  --format '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}')"
if [[ -n "$KIND" ]]; then "$KIND" delete cluster --name "$CLUSTER" >&2 || true; fi
docker ps -a --filter "label=io.x-k8s.kind.cluster=$CLUSTER" -q | xargs -r docker rm -f -v >/dev/null
for v in $volumes; do docker volume rm -f "$v" >/dev/null 2>&1 || true; done
docker network rm kind >/dev/null 2>&1 || true
rm -rf "$CACHE/kind/$CLUSTER.kubeconfig" "$CACHE/kind/$CLUSTER.yaml" "$VOLUMES"
left=""
[[ -z "$(docker ps -a --filter "label=io.x-k8s.kind.cluster=$CLUSTER" -q)" ]] || left+=" containers"
for v in $volumes; do docker volume inspect "$v" >/dev/null 2>&1 && left+=" volume:$v"; done
docker network inspect kind >/dev/null 2>&1 && left+=" network:kind"
bash "$HERE/docker.sh" down
[[ -z "$left" ]] || { log "left behind:$left"; exit 1; }
log "kind cluster $CLUSTER removed"
