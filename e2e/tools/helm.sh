#!/usr/bin/env bash
# Installs Helm from its Go module (no prebuilt download: only the Go module proxy is reachable here) into
# $WS_CACHE_DIR/bin, once, and prints the binary's path on stdout (nothing else goes to stdout):
#   HELM="$(bash e2e/tools/helm.sh)" && "$HELM" version
# A helm already on PATH is not used: the chart tests want the pinned version.
set -euo pipefail

HELM_VERSION="${WS_HELM_VERSION:-3.19.5}"
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
BIN="$CACHE/bin"
HELM="$BIN/helm-v$HELM_VERSION"
mkdir -p "$BIN"

if [[ ! -x "$HELM" ]]; then
  command -v go >/dev/null || { echo "helm.sh: go is not installed: cannot build helm" >&2; exit 1; }
  # Go needs a home for its caches; CI may run without HOME.
  export GOCACHE="${GOCACHE:-$(go env GOCACHE 2>/dev/null || true)}"
  [[ -n "$GOCACHE" && "$GOCACHE" != off ]] || export GOCACHE="$CACHE/go-build"
  export GOMODCACHE="${GOMODCACHE:-$(go env GOMODCACHE 2>/dev/null || true)}"
  [[ -n "$GOMODCACHE" ]] || export GOMODCACHE="$CACHE/go-mod"
  # One builder at a time: parallel tests may all ask at once.
  exec 9>"$CACHE/helm.lock"
  flock 9
  if [[ ! -x "$HELM" ]]; then
    echo "helm.sh: building helm v$HELM_VERSION from helm.sh/helm/v3 (a few minutes cold)" >&2
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # The Kubernetes version `helm template` and `helm lint` assume (as helm's own Makefile sets it from its
    # client-go); without it they assume 1.20 and refuse charts that need a newer cluster.
    k8s_minor=34
    pkg=helm.sh/helm/v3
    GOBIN="$tmp" CGO_ENABLED=0 nice -n 10 go install -trimpath -ldflags "-s -w \
      -X $pkg/internal/version.version=v$HELM_VERSION \
      -X $pkg/pkg/lint/rules.k8sVersionMajor=1 -X $pkg/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
      -X $pkg/pkg/chartutil.k8sVersionMajor=1 -X $pkg/pkg/chartutil.k8sVersionMinor=$k8s_minor" \
      "$pkg/cmd/helm@v$HELM_VERSION" >&2
    mv "$tmp/helm" "$HELM"
  fi
fi
echo "$HELM"
