# Writes container images without Docker or a registry: docker-archive tarballs that `ctr -n k8s.io images import`,
# `kind load image-archive` and `docker load` all accept, one layer each, reproducible (sorted entries, owner 0:0,
# mtime 0: the same files give the same image ID). Sourced by images/build.sh (weightstream's images) and
# e2e/kind/build.sh (the kind node's component images).

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

# The accounts file a non-root image needs so tools that look up the user (and glibc) find one: <rootfs> <uid>.
write_etc() {
  local rootfs="$1" uid="$2"
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

# Writes one docker-archive: <out file> <repo:tag> <user> <entrypoint json|null> <cmd json> <rootfs dir>
# [<env json array>]. The image's version label is the tag's. Prints "<file>  <tag>  <image id>".
write_archive() {
  local file="$1" tag="$2" user="$3" entrypoint="$4" cmd="$5" rootfs="$6"
  local env="${7:-[\"PATH=/usr/local/bin:/usr/bin:/bin\"]}"
  local dir
  dir="$(mktemp -d "$file.XXXXXX")"
  tar_dir "$rootfs" "$dir/layer.tar"
  local diff_id config_id
  diff_id="sha256:$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)"
  mkdir -p "$dir/${diff_id#sha256:}"
  mv "$dir/layer.tar" "$dir/${diff_id#sha256:}/layer.tar"
  local entry=""
  [[ "$entrypoint" != "null" ]] && entry="\"Entrypoint\":$entrypoint,"
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"User":"%s","Env":%s,%s"Cmd":%s,"WorkingDir":"/","Labels":{"org.opencontainers.image.source":"weightstream","org.opencontainers.image.version":"%s"}},"rootfs":{"type":"layers","diff_ids":["%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"images/build.sh"}]}' \
    "$user" "$env" "$entry" "$cmd" "${tag##*:}" "$diff_id" >"$dir/config.json"
  config_id="$(sha256sum "$dir/config.json" | cut -d' ' -f1)"
  mv "$dir/config.json" "$dir/$config_id.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$config_id" "$tag" "${diff_id#sha256:}" >"$dir/manifest.json"
  printf '{"%s":{"%s":"%s"}}' "${tag%:*}" "${tag##*:}" "$config_id" >"$dir/repositories"
  tar_dir "$dir" "$file.partial"
  mv "$file.partial" "$file"
  rm -rf "$dir"
  echo "$file  $tag  sha256:$config_id"
}

# The pod sandbox image: images/pause.c as one static binary, run as the conventional nobody-like 65535.
# <out file> <repo:tag> <pause.c>.
write_pause_image() {
  local file="$1" tag="$2" src="$3" rootfs
  rootfs="$(mktemp -d)"
  gcc -Os -s -static -Wall -Wextra -o "$rootfs/pause" "$src"
  write_archive "$file" "$tag" "65535:65535" '["/pause"]' '[]' "$rootfs"
  rm -rf "$rootfs"
}
