#!/usr/bin/env bash
# Builds weightstream's container images without Docker or a registry: docker-archive tarballs that
# `ctr -n k8s.io images import`, `kind load image-archive` and `docker load` all accept.
#
#   bash images/build.sh            # cargo build --release, then the three tarballs
#   WS_SKIP_CARGO=1 bash images/build.sh   # reuse target/release as it is
#
# Writes, under ${WS_IMAGES_DIR:-target/images}:
#   weightstream-operator-<version>.tar  weightstream/operator:<version>  weightstream-operator, weightstream-device-plugin
#   weightstream-runtime-<version>.tar   weightstream/runtime:<version>   memoryx, swarmx, sim-wse, input, examples/data/{mnist,moby-dick}
#   weightstream-pause-3.10.tar          weightstream/pause:3.10          /pause (the pod sandbox, static)
#
# Each image is one layer: the binaries (debug info stripped) in /usr/local/bin, exactly the shared libraries and loader `ldd` lists for
# them, and /etc/passwd, /etc/group, /etc/nsswitch.conf naming the non-root user 65532. No shell, no package
# manager; nothing needs to be written to the root filesystem, so it runs with readOnlyRootFilesystem.
# The archive is reproducible: sorted entries, owner 0:0, mtime 0, so the same binaries give the same image ID.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
out="${WS_IMAGES_DIR:-$root/target/images}"
release="${CARGO_TARGET_DIR:-$root/target}/release"
pause_tag="3.10"
uid=65532

if [[ -z "${WS_SKIP_CARGO:-}" ]]; then
  nice -n 10 cargo build --release --locked -p operator -p runtime -p sim-wse >&2
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# shellcheck source=images/archive.sh
source "$root/images/archive.sh"

# An image of release binaries: <name> <entrypoint json|null> <cmd json> <binaries...>.
binary_image() {
  local name="$1" entrypoint="$2" cmd="$3"
  shift 3
  local rootfs="$work/rootfs-$name" bin
  mkdir -p "$rootfs/usr/local/bin"
  write_etc "$rootfs" "$uid"
  # Input workers open a spec.data.path without a volume relative to their working directory (/), and the
  # examples say examples/data/...: ship the examples' data (the digits, the text) in the runtime image so the
  # examples run unchanged in a pod. Users' data comes from a volume (spec.data.volume) instead.
  if [[ "$name" == runtime ]]; then
    mkdir -p "$rootfs/examples/data/mnist" "$rootfs/examples/data/moby-dick"
    install -m 0644 examples/data/mnist/*-ubyte.gz "$rootfs/examples/data/mnist/"
    install -m 0644 examples/data/moby-dick/moby-dick.txt.gz "$rootfs/examples/data/moby-dick/"
  fi
  for bin in "$@"; do
    [[ -x "$release/$bin" ]] || { echo "missing $release/$bin: build it (or unset WS_SKIP_CARGO)" >&2; exit 1; }
    install -m 0755 "$release/$bin" "$rootfs/usr/local/bin/$bin"
    # The release profile keeps line tables for local backtraces; the image keeps symbols (function names in a
    # panic's backtrace) but not the line tables, a tenth of the size.
    strip --strip-debug "$rootfs/usr/local/bin/$bin"
    copy_libs "$rootfs" "$release/$bin"
  done
  write_archive "$out/weightstream-$name-$version.tar" "weightstream/$name:$version" "$uid:$uid" "$entrypoint" "$cmd" "$rootfs"
}

binary_image operator '["weightstream-operator"]' '[]' weightstream-operator weightstream-device-plugin
binary_image runtime null "$(json_array memoryx --help)" memoryx swarmx sim-wse input checkpoint-server

write_pause_image "$out/weightstream-pause-$pause_tag.tar" "weightstream/pause:$pause_tag" "$root/images/pause.c"
