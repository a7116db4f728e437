#!/usr/bin/env bash
# Everything a kind cluster needs on this machine, with no registry, built once and cached under
# $WS_CACHE_DIR/kind (so a warm run only starts nodes):
#   - binaries: kind (sigs.k8s.io/kind, pinned); kubeadm and kubectl (e2e/cluster/build.sh: the module and version
#     of the other Kubernetes parts); etcd and crictl from their Go modules;
#   - component images as docker-archives (images/archive.sh) under the names kubeadm asks for: the control plane
#     and kube-proxy from e2e/cluster/build.sh's binaries, etcd, CoreDNS, the pod sandbox (images/pause.c), and
#     kube-router (pod routes between the nodes and NetworkPolicy: kind's own CNI, kindnetd, is a module the Go
#     proxy does not serve), local-path-provisioner and its helper (Debian's static busybox);
#   - the node image, in e2e/kind/docker.sh's daemon: a base made as kind's (images/base in the kind module: its
#     entrypoint, units and containerd config) from a Debian rootfs (mmdebstrap), then the steps of
#     `kind build node-image` (binaries in /usr/bin, /kind/version, the CNI and storage manifests kind applies,
#     the images imported into the node's containerd), which itself fetches what it lacks from a registry.
# Needs root and DOCKER_HOST set to e2e/kind/docker.sh's daemon. Prints "name=value" lines on stdout: the kind
# binary, the kubectl binary, the node image; logs go to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
KIND_VERSION="${WS_KIND_VERSION:-0.30.0}"   # kind's release for Kubernetes 1.34 (its default node is v1.34.0)
K8S_VERSION="${WS_K8S_VERSION:-1.34.4}"
ETCD_VERSION="3.6.5"                         # the etcd kubeadm 1.34 runs (SupportedEtcdVersion), as 3.6.5-0
CRICTL_VERSION="1.34.0"
COREDNS_VERSION="${WS_COREDNS_VERSION:-1.14.7}"
KUBE_ROUTER_VERSION="${WS_KUBE_ROUTER_VERSION:-2.1.0}"
LOCAL_PATH_VERSION="0.0.30"                  # rancher's local-path-provisioner, kind's default storage
DEBIAN_SUITE="bookworm"                      # systemd 252: the last that runs on this host's cgroup v1
# shellcheck source=e2e/kind/common.sh
source "$HERE/common.sh"
K="$CACHE/kind"
BIN="$CACHE/bin"
IMAGES="$K/images"
mkdir -p "$K" "$BIN" "$IMAGES"
trap 'log "FAILED at line $LINENO: $BASH_COMMAND"' ERR
[[ -n "${DOCKER_HOST:-}" ]] || { log "DOCKER_HOST is not set: export DOCKER_HOST=\"\$(bash e2e/kind/docker.sh | tail -n1)\""; exit 1; }
# shellcheck source=images/archive.sh
source "$ROOT/images/archive.sh"

exec 9>"$K/build.lock"
flock 9

# --- Debian tools the build runs on the host ---
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
[[ -x /bin/busybox ]] || need+=(busybox-static)
if ((${#need[@]})); then
  log "installing ${need[*]} with apt-get"
  (exec 8>/tmp/weightstream-apt.lock && flock -w 900 8 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >&2
fi

# --- root filesystems from Debian ---
# The node's: kind's base image packages (images/base/Dockerfile) with Debian's containerd, runc and CNI plugins
# in place of the ones kind builds from git, then kind's files and the Dockerfile's steps.
KIND_SRC="$(cd "$K" && go mod download -json "sigs.k8s.io/kind@v$KIND_VERSION" | jq -r '.Dir')/images/base"
base_rootfs() {
  local out="$1"
  mmdebstrap --variant=minbase --include=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins \
    --customize-hook="bash '$HERE/node-rootfs.sh' \"\$1\" '$KIND_SRC/files'" \
    "$DEBIAN_SUITE" "$out" >&2
}
# kube-proxy's and kube-router's: what they run (iptables, ipset, nft, conntrack, ip), no more.
net_rootfs() {
  mmdebstrap --variant=essential --include=iptables,nftables,ipset,iproute2,conntrack,kmod \
    --customize-hook='rm -rf "$1"/usr/share/doc "$1"/usr/share/man "$1"/usr/share/locale "$1"/var/cache/apt' \
    "$DEBIAN_SUITE" "$1" >&2
}

# The node's base image and the network images' rootfs first: they wait on Debian's mirror and the disk, not on
# the CPU the builds below need.
BASE_IMAGE="weightstream/kind-base:$({ cat "$HERE/node-rootfs.sh"; echo "$KIND_VERSION $DEBIAN_SUITE"; } | sha256sum | cut -c1-12)"
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  start=$(date +%s)
  log "building the node's base image $BASE_IMAGE (mmdebstrap $DEBIAN_SUITE)"
  base_rootfs "$K/base.tar"
  docker import --change 'ENV container=docker' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint","/sbin/init"]' "$K/base.tar" "$BASE_IMAGE.noss" >&2
  # systemd stops on SIGRTMIN+3 (SIGTERM re-executes it); `docker import --change` cannot set a stop signal.
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$BASE_IMAGE.noss" | DOCKER_BUILDKIT=0 docker build -q -t "$BASE_IMAGE" - >&2
  docker rmi "$BASE_IMAGE.noss" >/dev/null
  rm -f "$K/base.tar"
  log "built the base image in $(($(date +%s) - start))s"
fi
[[ -d "$K/net-rootfs" ]] || { rm -rf "$K/net-rootfs.tmp"; net_rootfs "$K/net-rootfs.tmp" && mv "$K/net-rootfs.tmp" "$K/net-rootfs"; }

# --- binaries ---
declare -A B
while IFS='=' read -r name path; do B[$name]="$path"; done \
  < <(WS_K8S_EXTRA_CMDS="kubeadm kubectl" bash "$ROOT/e2e/cluster/build.sh")

# go_build_module <module@version> <package> <output>: one binary of a Go module, static, built in the module
# itself with its own go.mod and go.sum (the checksum database vouches for the module).
go_build_module() {
  local mod="$1" pkg="$2" out="$3" dir start
  [[ -x "$out" ]] && return 0
  start=$(date +%s)
  log "building $pkg from $mod"
  dir="$(cd "$K" && go mod download -json "$mod" | jq -r '.Dir')"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly nice -n "${WS_NICE:-19}" go build -C "$dir" -trimpath -ldflags "-s -w" \
    -o "$out.tmp" "$pkg" >&2
  mv "$out.tmp" "$out"
  log "built $(basename "$out") in $(($(date +%s) - start))s"
}
go_build_module "sigs.k8s.io/kind@v$KIND_VERSION" . "$BIN/kind-v$KIND_VERSION"
go_build_module "sigs.k8s.io/cri-tools@v$CRICTL_VERSION" ./cmd/crictl "$BIN/crictl-v$CRICTL_VERSION"
go_build_module "github.com/rancher/local-path-provisioner@v$LOCAL_PATH_VERSION" . \
  "$BIN/local-path-provisioner-v$LOCAL_PATH_VERSION"
# etcd's server module points its sibling modules at ../api and the like, which its zip lacks: it is built as a
# dependency of a module of our own instead (as e2e/apiserver/build.sh does), where those directives do not apply.
if [[ ! -x "$BIN/etcd-v$ETCD_VERSION" ]]; then
  start=$(date +%s)
  log "building etcd v$ETCD_VERSION"
  W="$K/etcd-wrapper-v$ETCD_VERSION"
  mkdir -p "$W"
  [[ -f "$W/go.mod" ]] || (cd "$W" && go mod init ws-etcd-wrapper >&2)
  (cd "$W" && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2 \
    && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n "${WS_NICE:-19}" go build -trimpath -ldflags "-s -w" \
      -o "$BIN/etcd-v$ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3 >&2)
  mv "$BIN/etcd-v$ETCD_VERSION.tmp" "$BIN/etcd-v$ETCD_VERSION"
  log "built etcd in $(($(date +%s) - start))s"
fi

# --- component images ---
# archive_of <repo:tag> <file>: sets ARCHIVE to the cached archive of that image made from that file, named after
# both (a hash of the file), so a renamed image or a rebuilt binary makes a new archive; the archives not named
# this run are removed below.
wanted=()
archive_of() {
  ARCHIVE="$IMAGES/$(tr '/:' '__' <<<"$1")-$(sha256sum "$2" | cut -c1-12).tar"
  wanted+=("$ARCHIVE")
}
# static_image <repo:tag> <binary> <name in /usr/local/bin> [<entrypoint json>]
static_image() {
  local tag="$1" bin="$2" name="$3" entry="${4:-null}" rootfs file
  archive_of "$tag" "$bin"; file="$ARCHIVE"
  [[ -f "$file" ]] && return 0
  rootfs="$(mktemp -d)"
  mkdir -p "$rootfs/usr/local/bin"
  write_etc "$rootfs" 65532
  install -m 0755 "$bin" "$rootfs/usr/local/bin/$name"
  write_archive "$file" "$tag" "0" "$entry" '[]' "$rootfs" \
    '["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]' >&2
  rm -rf "$rootfs"
}
# net_image <repo:tag> <binary> <name in /usr/local/bin>
net_image() {
  local tag="$1" bin="$2" name="$3" rootfs file
  archive_of "$tag" "$bin"; file="$ARCHIVE"
  [[ -f "$file" ]] && return 0
  rootfs="$(mktemp -d)"
  cp -a "$K/net-rootfs/." "$rootfs/"
  install -m 0755 "$bin" "$rootfs/usr/local/bin/$name"
  write_archive "$file" "$tag" "0" null '[]' "$rootfs" \
    '["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]' >&2
  rm -rf "$rootfs"
}
V="v$K8S_VERSION"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  static_image "registry.k8s.io/$c:$V" "${B[$c]}" "$c"
done
static_image "registry.k8s.io/etcd:$ETCD_VERSION-0" "$BIN/etcd-v$ETCD_VERSION" etcd
tag="registry.k8s.io/coredns/coredns:v$COREDNS_VERSION"
archive_of "$tag" "${B[coredns]}"; file="$ARCHIVE"
[[ -f "$file" ]] || {
  rootfs="$(mktemp -d)"
  install -m 0755 "${B[coredns]}" "$rootfs/coredns"
  write_archive "$file" "$tag" 0 '["/coredns"]' '[]' "$rootfs" >&2
  rm -rf "$rootfs"
}
tag="docker.io/weightstream/pause:3.10"
archive_of "$tag" "$ROOT/images/pause.c"; file="$ARCHIVE"
[[ -f "$file" ]] || write_pause_image "$file" "$tag" "$ROOT/images/pause.c" >&2
net_image "registry.k8s.io/kube-proxy:$V" "${B[kube-proxy]}" kube-proxy
net_image "docker.io/weightstream/kube-router:v$KUBE_ROUTER_VERSION" "${B[kube-router]}" kube-router
static_image "docker.io/weightstream/local-path-provisioner:v$LOCAL_PATH_VERSION" \
  "$BIN/local-path-provisioner-v$LOCAL_PATH_VERSION" local-path-provisioner
# The provisioner's helper pod runs `sh /script/setup` (mkdir -m 0777 -p) and `sh /script/teardown` (rm -rf):
# Debian's static busybox as those three.
BUSYBOX_VERSION="$(dpkg-query -W -f '${Version}' busybox-static | sed 's/^[0-9]*://; s/[^A-Za-z0-9_.-]/_/g')"
tag="docker.io/weightstream/local-path-helper:$BUSYBOX_VERSION"
archive_of "$tag" /bin/busybox; file="$ARCHIVE"
[[ -f "$file" ]] || {
  rootfs="$(mktemp -d)"
  mkdir -p "$rootfs/bin" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  install -m 0755 /bin/busybox "$rootfs/bin/busybox"
  for t in sh mkdir rm; do ln -s busybox "$rootfs/bin/$t"; done
  write_archive "$file" "$tag" 0 null '["/bin/sh"]' "$rootfs" '["PATH=/bin"]' >&2
  rm -rf "$rootfs"
}
for file in "$IMAGES"/*.tar; do
  printf '%s\n' "${wanted[@]}" | grep -qxF "$file" || rm -f "$file"
done
# What kind applies once the control plane is up (/kind/manifests in the node image): the CNI and the storage.
render() {
  sed -e "s|\${KUBE_ROUTER_VERSION}|$KUBE_ROUTER_VERSION|g" -e "s|\${LOCAL_PATH_VERSION}|$LOCAL_PATH_VERSION|g" \
    -e "s|\${BUSYBOX_VERSION}|$BUSYBOX_VERSION|g" -e "s|\${VOLUMES}|$VOLUMES|g" "$1"
}

# --- the node image: named after what went into it, so a change to any of it builds a new one ---
inputs="$(
  cat "$HERE/build.sh" "$HERE/node-rootfs.sh" "$HERE/offline/kube-router.yaml" "$HERE/offline/storage.yaml"
  echo "$KIND_VERSION $K8S_VERSION $ETCD_VERSION $CRICTL_VERSION $DEBIAN_SUITE $VOLUMES"
  sha256sum "$IMAGES"/*.tar "${B[kubelet]}" "${B[kubeadm]}" "${B[kubectl]}" | cut -d' ' -f1
)"
NODE_IMAGE="weightstream/kind-node:$V-$(sha256sum <<<"$inputs" | cut -c1-12)"
if ! docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
  start=$(date +%s)
  log "building the node image $NODE_IMAGE"
  id="$(docker run -d --entrypoint=sleep --security-opt seccomp=unconfined "$BASE_IMAGE" infinity)"
  trap 'docker rm -f -v "$id" >/dev/null 2>&1 || true' EXIT
  for b in kubeadm kubelet kubectl; do docker cp "${B[$b]}" "$id:/usr/bin/$b"; done
  docker cp "$BIN/crictl-v$CRICTL_VERSION" "$id:/usr/local/bin/crictl"
  docker exec "$id" sh -c 'chown root:root /usr/bin/kube* /usr/local/bin/crictl && chmod 0755 /usr/bin/kube* /usr/local/bin/crictl'
  printf '%s' "$V" | docker exec -i "$id" sh -c 'mkdir -p /kind/manifests && cat >/kind/version'
  render "$HERE/offline/kube-router.yaml" | docker exec -i "$id" sh -c 'cat >/kind/manifests/default-cni.yaml'
  render "$HERE/offline/storage.yaml" | docker exec -i "$id" sh -c 'cat >/kind/manifests/default-storage.yaml'
  docker exec "$id" bash -c 'nohup containerd >/dev/null 2>&1 &'
  for _ in $(seq 1 100); do docker exec "$id" ctr info >/dev/null 2>&1 && break; sleep 0.2; done
  for t in "$IMAGES"/*.tar; do
    docker exec -i "$id" ctr -n k8s.io images import --all-platforms --no-unpack --digests - <"$t" >&2
  done
  docker exec "$id" ctr -n k8s.io images ls -q | grep -v '^sha256:' >&2
  docker exec "$id" pkill containerd
  for _ in $(seq 1 50); do docker exec "$id" pgrep containerd >/dev/null || break; sleep 0.2; done
  docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint","/sbin/init"]' "$id" "$NODE_IMAGE" >/dev/null
  log "built the node image in $(($(date +%s) - start))s"
  # The images of earlier inputs are not used again (a container still running one keeps it).
  docker images --format '{{.Repository}}:{{.Tag}}' \
    | grep -E '^weightstream/kind-(node|base):' | grep -vxF -e "$NODE_IMAGE" -e "$BASE_IMAGE" \
    | xargs -r docker rmi >/dev/null 2>&1 || true
fi

echo "kind=$BIN/kind-v$KIND_VERSION"
echo "kubectl=${B[kubectl]}"
echo "node-image=$NODE_IMAGE"
