#!/usr/bin/env bash
# The end-to-end path on kind, the same steps as e2e/cluster/ runs here without Docker:
#   1. create a kind cluster        2. build the images as tarballs and load them into the node
#   3. helm install the chart       4. cargo test -p e2e --test cluster against the cluster
# Needs docker, kind, kubectl, Go (for helm, via e2e/tools/helm.sh) and Rust. Run from anywhere:
#   bash e2e/kind/run.sh            # WS_KIND_KEEP=1 keeps the cluster afterwards
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
cluster="${WS_KIND_CLUSTER:-weightstream}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
export KUBECONFIG="${KUBECONFIG:-$root/target/kind-$cluster.kubeconfig}"
mkdir -p "$(dirname "$KUBECONFIG")"

log() { echo "[kind/run.sh $(date -u +%H:%M:%S)] $*" >&2; }
cleanup() {
  if [[ -z "${WS_KIND_KEEP:-}" ]]; then
    log "deleting kind cluster $cluster"
    kind delete cluster --name "$cluster" >&2 || true
  fi
}

log "1/4 creating kind cluster $cluster"
kind get clusters 2>/dev/null | grep -qx "$cluster" || kind create cluster --name "$cluster" --config e2e/kind/kind-config.yaml --wait 120s
kind export kubeconfig --name "$cluster" --kubeconfig "$KUBECONFIG"
trap cleanup EXIT

log "2/4 building images and loading them into the node"
bash images/build.sh
for image in operator runtime; do
  kind load image-archive "target/images/weightstream-$image-$version.tar" --name "$cluster"
done

# The same release, namespace and values as the suite's own install (e2e/src/cluster.rs), which then finds
# it in place: an upgrade with nothing to change.
log "3/4 installing the chart"
WS_HELM="$(bash e2e/tools/helm.sh)"
export WS_HELM
"$WS_HELM" upgrade --install weightstream charts/weightstream --namespace weightstream-system --create-namespace \
  --set devicePlugin.enabled=true --set devicePlugin.devicesPerNode=4 --set operator.pollSeconds=1 \
  --wait --timeout 5m

log "4/4 running the e2e suite"
cargo test --release --locked -p e2e --test cluster -- --test-threads=1
