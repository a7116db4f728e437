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

# Copies each dynamic library (and the loader) a binary needs to the same path inside the image root.
copy_libs() {
  local rootfs="$1" bin="$2" name arrow path rest lib
  # ldd prints "name => /path (addr)" for a library, "/path (addr)" for the loader, "name (addr)" for the vdso
  # and "name => not found" for a library it cannot find, which would fail in the container: refuse it here.
  while read -r name arrow path rest; do
    if [[ "$arrow" == "=>" && "$path" == /* ]]; then
      lib="$path"
    elif [[ "$arrow" == "=>" ]]; then
      echo "ldd $bin: $name $arrow $path $rest" >&2
      exit 1
    elif [[ "$name" == /* ]]; then
      lib="$name"
    else
      continue
    fi
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done < <(ldd "$bin")
}

# The accounts file a non-root image needs so tools that look up the user (and glibc) find one.
write_etc() {
  local rootfs="$1"
  mkdir -p "$rootfs/etc" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n' "$uid" "$uid" >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%d:\n' "$uid" >"$rootfs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  mkdir -p "$rootfs/home/nonroot"
  chmod 0755 "$rootfs/home/nonroot"
}

# A reproducible tar of a directory's contents, entry names without a "./" prefix (as docker save writes them,
# and as tools that read one member by name, e.g. `tar -xOf x.tar manifest.json`, expect).
tar_dir() {
  local dir="$1" file="$2"
  (cd "$dir" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort \
    | tar --no-recursion --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -T - -cf "$file")
}

# JSON array of strings from the arguments (the values here are plain words, so quoting suffices).
json_array() {
  local first=1 s
  printf '['
  for s in "$@"; do
    ((first)) || printf ','
    first=0
    printf '"%s"' "$s"
  done
  printf ']'
}

# Writes one docker-archive: <out file> <repo:tag> <user> <entrypoint json> <cmd json> <rootfs dir>.
write_archive() {
  local file="$1" tag="$2" user="$3" entrypoint="$4" cmd="$5" rootfs="$6"
  local dir
  dir="$work/archive-$(basename "$file" .tar)"
  mkdir -p "$dir"
  tar_dir "$rootfs" "$dir/layer.tar"
  local diff_id config_id
  diff_id="sha256:$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)"
  mkdir -p "$dir/${diff_id#sha256:}"
  mv "$dir/layer.tar" "$dir/${diff_id#sha256:}/layer.tar"
  local entry=""
  [[ "$entrypoint" != "null" ]] && entry="\"Entrypoint\":$entrypoint,"
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"User":"%s","Env":["PATH=/usr/local/bin:/usr/bin:/bin"],%s"Cmd":%s,"WorkingDir":"/","Labels":{"org.opencontainers.image.source":"weightstream","org.opencontainers.image.version":"%s"}},"rootfs":{"type":"layers","diff_ids":["%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"images/build.sh"}]}' \
    "$user" "$entry" "$cmd" "$version" "$diff_id" >"$dir/config.json"
  config_id="$(sha256sum "$dir/config.json" | cut -d' ' -f1)"
  mv "$dir/config.json" "$dir/$config_id.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$config_id" "$tag" "${diff_id#sha256:}" >"$dir/manifest.json"
  printf '{"%s":{"%s":"%s"}}' "${tag%:*}" "${tag##*:}" "$config_id" >"$dir/repositories"
  tar_dir "$dir" "$file.partial"
  mv "$file.partial" "$file"
  echo "$file  $tag  sha256:$config_id"
}

# An image of release binaries: <name> <entrypoint json|null> <cmd json> <binaries...>.
binary_image() {
  local name="$1" entrypoint="$2" cmd="$3"
  shift 3
  local rootfs="$work/rootfs-$name" bin
  mkdir -p "$rootfs/usr/local/bin"
  write_etc "$rootfs"
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

# The sandbox image: one static binary, run as the conventional nobody-like 65535.
pause_root="$work/rootfs-pause"
mkdir -p "$pause_root"
gcc -Os -s -static -Wall -Wextra -o "$pause_root/pause" images/pause.c
write_archive "$out/weightstream-pause-$pause_tag.tar" "weightstream/pause:$pause_tag" "65535:65535" '["/pause"]' '[]' "$pause_root"
