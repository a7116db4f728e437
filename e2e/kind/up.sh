#!/usr/bin/env bash
# A kind cluster of one control plane and two workers, built and run here with no registry (e2e/kind/build.sh),
# with weightstream's images loaded and its chart installed, each worker offering CS-2s through the chart's device
# plugin. Reuses the cluster when it is already up. Prints the kubeconfig's path as its last line.
#
#   KUBECONFIG="$(bash e2e/kind/up.sh | tail -n1)"     bash e2e/kind/down.sh
#
# The images must be in target/images (bash images/build.sh). Needs root (Docker, mmdebstrap); with internet and a
# Docker of your own, e2e/kind/run.sh takes kind's stock images instead.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=e2e/kind/common.sh
source "$HERE/common.sh"
CS2_PER_WORKER="${WS_KIND_CS2_PER_WORKER:-2}"
KC="$CACHE/kind/$CLUSTER.kubeconfig"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
trap 'log "FAILED at line $LINENO: $BASH_COMMAND"' ERR

DOCKER_HOST="$(bash "$HERE/docker.sh" | tail -n1)"
export DOCKER_HOST
built="$(bash "$HERE/build.sh")"
declare -A B
while IFS='=' read -r name value; do B[$name]="$value"; done <<<"$built"
kind() { "${B[kind]}" "$@"; }
kubectl() { "${B[kubectl]}" --kubeconfig "$KC" "$@"; }
# wait_until <seconds> <what> <command...>
wait_until() {
  local deadline=$((SECONDS + $1)) what="$2"
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "timed out after waiting for $what"; return 1; }
    sleep 2
  done
}
nodes_ready() { ! kubectl get nodes --no-headers | awk '{print $2}' | grep -vqx Ready && kubectl get nodes --no-headers | grep -q .; }

# The cluster answers with three Ready nodes of this node image: reuse it. Anything less: start afresh.
running_image="$(docker ps --filter "label=io.x-k8s.kind.cluster=$CLUSTER" --format '{{.Image}}' | sort -u)"
if [[ "$running_image" == "${B[node-image]}" && -s "$KC" ]] && nodes_ready \
  && [[ "$(kubectl get nodes --no-headers | wc -l)" == 3 ]]; then
  log "kind cluster $CLUSTER is up"
else
  kind delete cluster --name "$CLUSTER" >&2 2>/dev/null || true
  # Created here, IPv4 only: kind would ask for an IPv6 subnet too, and falls back only on one Docker error.
  docker network inspect kind >/dev/null 2>&1 || docker network create kind >/dev/null
  mkdir -p "$(dirname "$KC")"
  config="$CACHE/kind/$CLUSTER.yaml"
  # Every node mounts this folder where the storage provisioner makes volumes (offline/storage.yaml).
  mkdir -p "$VOLUMES"
  sed -e "s|\${NODE_IMAGE}|${B[node-image]}|g" -e "s|\${COREDNS_VERSION}|${WS_COREDNS_VERSION:-1.14.7}|g" \
    -e "s|\${VOLUMES}|$VOLUMES|g" -e "s|^name: .*|name: $CLUSTER|" "$HERE/offline/cluster.yaml" >"$config"
  start=$SECONDS
  log "creating kind cluster $CLUSTER (1 control plane, 2 workers) from ${B[node-image]}"
  kind create cluster --config "$config" --kubeconfig "$KC" --retain >&2
  wait_until 240 "three Ready nodes" nodes_ready
  log "three nodes Ready in $((SECONDS - start))s"
fi

# weightstream's images into every node (a node that has them already imports nothing new).
for image in operator runtime; do
  tar="$ROOT/target/images/weightstream-$image-$VERSION.tar"
  [[ -f "$tar" ]] || { log "missing $tar: run bash images/build.sh"; exit 1; }
  kind load image-archive "$tar" --name "$CLUSTER" >&2
done

# The chart, as the suite installs it (e2e/src/cluster.rs then finds it in place), CS-2s on the workers only.
HELM="${WS_HELM:-$(bash "$ROOT/e2e/tools/helm.sh")}"
"$HELM" upgrade --install weightstream "$ROOT/charts/weightstream" --kubeconfig "$KC" \
  --namespace weightstream-system --create-namespace \
  --set devicePlugin.enabled=true --set "devicePlugin.devicesPerNode=$CS2_PER_WORKER" \
  --set-json 'devicePlugin.nodeSelector={"weightstream.dev/cs2-host":"true"}' \
  --set operator.pollSeconds=1 --wait --timeout 5m >&2
echo "$KC"
