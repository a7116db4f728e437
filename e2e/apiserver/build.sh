#!/usr/bin/env bash
# Builds kube-apiserver from the Go module k8s.io/kubernetes (through a wrapper module whose replace
# directives map each staging module to its published version) and installs etcd, caching both under
# $WS_CACHE_DIR. Prints nothing on stdout but the two binary paths, one per line: etcd then kube-apiserver.
# Why a wrapper: k8s.io/kubernetes requires its staging modules at v0.0.0 and its module zip omits staging/.
set -euo pipefail

K8S_VERSION="${WS_K8S_VERSION:-1.34.4}"
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
BIN="$CACHE/bin"
APISERVER="$BIN/kube-apiserver-v$K8S_VERSION"
mkdir -p "$BIN"
# Go needs a home for its caches; CI may run without HOME.
export GOCACHE="${GOCACHE:-$(go env GOCACHE 2>/dev/null || true)}"
[[ -n "$GOCACHE" && "$GOCACHE" != off ]] || export GOCACHE="$CACHE/go-build"
export GOMODCACHE="${GOMODCACHE:-$(go env GOMODCACHE 2>/dev/null || true)}"
[[ -n "$GOMODCACHE" ]] || export GOMODCACHE="$CACHE/go-mod"
[[ -n "${HOME:-}" ]] || export GOPATH="${GOPATH:-$CACHE/go}"

log() { echo "[build.sh $(date -u +%H:%M:%S)] $*" >&2; }
trap 'log "FAILED at line $LINENO: $BASH_COMMAND"' ERR

# One builder at a time: parallel test binaries may all ask for the binaries at once.
exec 9>"$CACHE/build.lock"
flock 9

# --- etcd: Debian's etcd-server, else built from its Go module. ---
ETCD="$(command -v etcd || true)"
if [[ -z "$ETCD" && -x "$BIN/etcd" ]]; then ETCD="$BIN/etcd"; fi
if [[ -z "$ETCD" ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    log "installing etcd-server with apt-get"
    (exec 8>/tmp/weightstream-apt.lock && flock -w 900 8 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server) >&2 || true
    ETCD="$(command -v etcd || true)"
  fi
fi
if [[ -z "$ETCD" ]]; then
  log "building etcd from go.etcd.io/etcd/server/v3"
  W="$CACHE/etcd-wrapper"; mkdir -p "$W"
  (cd "$W" && [[ -f go.mod ]] || (cd "$W" && go mod init ws-etcd-wrapper >&2))
  (cd "$W" && GOFLAGS=-mod=mod go get go.etcd.io/etcd/server/v3@v3.5.21 >&2 \
    && CGO_ENABLED=0 go build -o "$BIN/etcd" go.etcd.io/etcd/server/v3 >&2)
  ETCD="$BIN/etcd"
fi
# Debian's etcd-server starts a system service on install; the tests run their own on other ports.
if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
  systemctl stop etcd >&2 || true
fi

# --- kube-apiserver ---
if [[ ! -x "$APISERVER" ]]; then
  command -v go >/dev/null || { log "go is not installed: cannot build kube-apiserver"; exit 1; }
  START=$(date +%s)
  W="$CACHE/k8s-wrapper-v$K8S_VERSION"
  mkdir -p "$W"
  log "building kube-apiserver v$K8S_VERSION in $W (a cold build takes a long while on 2 cores)"
  go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >"$W/download.json" \
    || { log "cannot download k8s.io/kubernetes@v$K8S_VERSION: $(cat "$W/download.json")"; exit 1; }
  MODFILE="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$K8S_VERSION.mod"
  STAGING=$(sed -n 's/^\s*\(k8s\.io\/[a-z0-9-]*\) v0\.0\.0$/\1/p' "$MODFILE" | sort -u)
  MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
  STAGING_V="v0.${K8S_VERSION#1.}"
  {
    echo "module ws-kube-apiserver-wrapper"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    for m in $STAGING; do echo "	$m => $m $STAGING_V"; done
    echo ")"
  } > "$W/go.mod"
  cat > "$W/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
  cd "$W"
  GOFLAGS=-mod=mod go mod tidy -e >&2 || GOFLAGS=-mod=mod go get "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" >&2
  LD="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LD="$LD -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
  done
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$LD" -o "$APISERVER.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
  mv "$APISERVER.tmp" "$APISERVER"
  log "built $APISERVER in $(( $(date +%s) - START ))s"
fi

echo "$ETCD"
echo "$APISERVER"
