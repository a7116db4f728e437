#!/usr/bin/env bash
# Installs Kueue into the cluster at $KUBECONFIG and waits until it answers: its CRDs, its controller (webhooks,
# visibility API) and a configuration for weightstream. Nothing is pulled (no registry here): Kueue is built from
# its Go module, pinned, and its image is written like weightstream's own and imported into the nodes of the
# suite's kind cluster ($WS_KIND_CLUSTER, default weightstream) or into the suite's local node (e2e/cluster).
# Another cluster must have the image weightstream/kueue:v$KUEUE_VERSION in its nodes already.
#
#   KUBECONFIG=~/.cache/weightstream/kind/weightstream.kubeconfig bash e2e/kueue/up.sh
#
# The binary and the image come from e2e/kueue/build.sh (cached under $WS_CACHE_DIR, ~5 min on 2 cores once).
# Run again, up.sh changes nothing that is in place. The configuration (see kueue-config.yaml beside this script):
#   - TrainingJob is an external framework: Kueue leaves alone the pods of a job it admits as one Workload;
#   - cpu, memory and ephemeral storage are not counted against quota: a ClusterQueue may cover
#     weightstream.dev/cs2 alone;
#   - waitForPodsReady 10 min (the operator reports PodsReady), and only the batch/job integration, so Kueue's
#     webhooks do not stand between the cluster and every pod it creates.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
KUEUE_VERSION="${WS_KUEUE_VERSION:-0.19.2}"
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
CLUSTER="${WS_KIND_CLUSTER:-weightstream}"
BIN="$CACHE/bin"
IMAGE="weightstream/kueue:v$KUEUE_VERSION"
log() { echo "[kueue/up.sh $(date -u +%H:%M:%S)] $*" >&2; }
[[ -n "${KUBECONFIG:-}" && -s "$KUBECONFIG" ]] || { log "set KUBECONFIG to the cluster to install Kueue into"; exit 1; }
KUBECTL="$(command -v kubectl || ls "$BIN"/kubectl-v* 2>/dev/null | tail -n1 || true)"
[[ -x "$KUBECTL" ]] || { log "no kubectl: run bash e2e/kind/up.sh first (it builds one)"; exit 1; }
kubectl() { "$KUBECTL" "$@"; }
# The binary and the image (cached; built once).
TARBALL="$(bash "$HERE/build.sh")"
export GOMODCACHE="${GOMODCACHE:-$(go env GOMODCACHE 2>/dev/null || true)}"
[[ -n "$GOMODCACHE" ]] || export GOMODCACHE="$CACHE/go-mod"
# The module's own manifests (config/), from the module cache the build filled.
SRC="$(cd /tmp && go mod download -json "sigs.k8s.io/kueue@v$KUEUE_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$SRC/config/default" ]] || { log "no config/default in the module at '$SRC'"; exit 1; }

# Into the kind cluster's nodes (a node that has the image already imports nothing new).
# The suite's Docker daemon (e2e/kind/docker.sh) when it runs and no other is named.
if [[ -z "${DOCKER_HOST:-}" && -S "$CACHE/docker/docker.sock" ]]; then
  export DOCKER_HOST="unix://$CACHE/docker/docker.sock"
fi
nodes=""
if kubectl get node "$CLUSTER-control-plane" >/dev/null 2>&1; then
  nodes="$(docker ps --filter "label=io.x-k8s.kind.cluster=$CLUSTER" -q 2>/dev/null || true)"
fi
if [[ -n "$nodes" ]]; then
  for id in $nodes; do
    docker exec -i "$id" ctr -n k8s.io images import --no-unpack - <"$TARBALL" >/dev/null
  done
  log "image $IMAGE imported into the nodes of kind cluster $CLUSTER"
elif host_ctr="$(sed -n 's/^ctr=//p' "$CACHE/cluster/binaries" 2>/dev/null)" && [[ -x "$host_ctr" ]] \
  && [[ -S "$CACHE/cluster/containerd/containerd.sock" ]] && kubectl get node ws-node >/dev/null 2>&1; then
  # The suite's local node (e2e/cluster): its own containerd.
  "$host_ctr" --address "$CACHE/cluster/containerd/containerd.sock" -n k8s.io images import "$TARBALL" >/dev/null
  log "image $IMAGE imported into the local node's containerd"
else
  log "neither the kind cluster $CLUSTER nor the local node is here: the nodes must already have $IMAGE (from $TARBALL)"
fi

# The manifests: Kueue's config/default with our image, configuration and a read grant on TrainingJobs.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$SRC/config" "$work/config"
chmod -R u+w "$work/config"
cp "$HERE/kueue-config.yaml" "$work/config/components/manager/controller_manager_config.yaml"
mkdir -p "$work/config/weightstream"
cp "$HERE/trainingjob-reader.yaml" "$work/config/weightstream/"
cat >"$work/config/weightstream/kustomization.yaml" <<YAML
resources:
- ../default
- trainingjob-reader.yaml
images:
# Kueue's components/manager names its staging image; ours replaces it.
- name: us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue
  newName: weightstream/kueue
  newTag: v$KUEUE_VERSION
patches:
- patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: IfNotPresent
    - op: add
      path: /spec/template/metadata/annotations/weightstream.dev~1config-hash
      value: "$(sha256sum "$HERE/kueue-config.yaml" | cut -c1-16)"
  target:
    kind: Deployment
    name: kueue-controller-manager
YAML
kubectl kustomize "$work/config/weightstream" >"$work/kueue.yaml"
log "applying Kueue v$KUEUE_VERSION ($(grep -c '^kind:' "$work/kueue.yaml") objects)"
kubectl apply --server-side --force-conflicts -f "$work/kueue.yaml" >/dev/null
# (A changed configuration changes the pods' config-hash annotation, so they restart with it.)
kubectl -n kueue-system rollout status deployment/kueue-controller-manager --timeout=300s >&2

# Answering: its webhooks admit a ResourceFlavor (server-side dry run) and its visibility API is served.
deadline=$((SECONDS + 300))
probe='{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ResourceFlavor","metadata":{"name":"up-sh-probe"}}'
until echo "$probe" | kubectl apply --dry-run=server -f - >/dev/null 2>&1 \
  && kubectl get --raw "/apis/visibility.kueue.x-k8s.io/v1beta2" >/dev/null 2>&1; do
  if ((SECONDS > deadline)); then
    log "Kueue did not answer within 300 s:"
    echo "$probe" | kubectl apply --dry-run=server -f - >&2 || true
    kubectl -n kueue-system logs deployment/kueue-controller-manager --tail=30 >&2 || true
    exit 1
  fi
  sleep 3
done
log "Kueue v$KUEUE_VERSION answers"
