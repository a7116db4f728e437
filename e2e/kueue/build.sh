#!/usr/bin/env bash
# Builds Kueue from its Go module (pinned; only the Go module proxy is reachable here) and its image, once, and
# prints the image tarball's path on stdout (nothing else goes to stdout):
#   TARBALL="$(bash e2e/kueue/build.sh)"   # weightstream/kueue:v$KUEUE_VERSION, /manager as user 65532
# Cached under $WS_CACHE_DIR (~/.cache/weightstream): bin/kueue-v<version> (~8 CPU-min to build) and
# images/kueue-v<version>.tar. e2e/kueue/up.sh installs it; .ci/run builds it in the background.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
KUEUE_VERSION="${WS_KUEUE_VERSION:-0.19.2}"
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
BIN="$CACHE/bin"
KUEUE="$BIN/kueue-v$KUEUE_VERSION"
IMAGE="weightstream/kueue:v$KUEUE_VERSION"
TARBALL="$CACHE/images/kueue-v$KUEUE_VERSION.tar"
log() { echo "[kueue/build.sh $(date -u +%H:%M:%S)] $*" >&2; }
command -v go >/dev/null || { log "go is not installed: cannot build Kueue"; exit 1; }
mkdir -p "$BIN" "$CACHE/images"
export GOCACHE="${GOCACHE:-$(go env GOCACHE 2>/dev/null || true)}"
[[ -n "$GOCACHE" && "$GOCACHE" != off ]] || export GOCACHE="$CACHE/go-build"
export GOMODCACHE="${GOMODCACHE:-$(go env GOMODCACHE 2>/dev/null || true)}"
[[ -n "$GOMODCACHE" ]] || export GOMODCACHE="$CACHE/go-mod"

# The binary, once (one builder at a time).
exec 9>"$CACHE/kueue.lock"
flock 9
if [[ ! -x "$KUEUE" ]]; then
  log "building Kueue v$KUEUE_VERSION from sigs.k8s.io/kueue (a few minutes cold)"
  tmp="$(mktemp -d)"
  GOBIN="$tmp" CGO_ENABLED=0 nice -n 10 go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@v$KUEUE_VERSION" >&2
  mv "$tmp/kueue" "$KUEUE"
  rm -rf "$tmp"
fi
# The image: the static binary as /manager, user 65532, nothing else.
if [[ ! -s "$TARBALL" || "$TARBALL" -ot "$KUEUE" ]]; then
  # shellcheck source=images/archive.sh
  source "$ROOT/images/archive.sh"
  rootfs="$(mktemp -d)"
  write_etc "$rootfs" 65532
  install -m 0755 "$KUEUE" "$rootfs/manager"
  write_archive "$TARBALL" "$IMAGE" "65532:65532" '["/manager"]' '[]' "$rootfs" >&2
  rm -rf "$rootfs"
fi

echo "$TARBALL"
