#!/usr/bin/env bash
# Everything a single-node cluster needs, built or installed once and cached:
#   - etcd and kube-apiserver: e2e/apiserver/build.sh (Debian's etcd-server; kube-apiserver from k8s.io/kubernetes
#     through its wrapper module);
#   - kube-controller-manager, kube-scheduler, kubelet, kube-proxy: built in that same wrapper module (same Go
#     module and build caches, same version ldflags), so the second and later commands reuse the first's packages;
#   - CoreDNS from its Go module, with only the plugins the clusters' Corefiles use (a main of our own);
#   - kube-router (only its network-policy controller is run, by up.sh) from its Go module, the same way;
#   - kwok (fakes the nodes the scale tests add, and their pods) from its Go module sigs.k8s.io/kwok;
#   - containerd, runc, the CNI plugins, iptables, conntrack from Debian (apt-get, only when missing).
# Prints "name=path" lines on stdout (one per binary); logs go to stderr. Needs root for apt-get.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION="${WS_K8S_VERSION:-1.34.4}"
COREDNS_VERSION="${WS_COREDNS_VERSION:-1.14.7}"
# kube-router's network-policy controller (iptables + ipset) enforces NetworkPolicy on the node. v2.1.0 is the
# newest release the Go module proxy serves here (later ones answer 403 "not available").
# The checksum database has no entry for it here (404), so the module's hash is pinned below instead: it is
# the h1: hash of the module as served, checked against the v2.1.0 tag of the upstream repository's sources.
KUBE_ROUTER_VERSION="${WS_KUBE_ROUTER_VERSION:-2.1.0}"
KUBE_ROUTER_SUM="${WS_KUBE_ROUTER_SUM:-h1:xWsptKtmZ44L+NjwFKoFAFlVdxCz8fka9A/eYJe95Ok=}"
# kwok fakes nodes and the pods scheduled onto them (no kubelet, no containers): the scale tests' 48 hosts of
# 4 CS-2s each. It manages only nodes annotated kwok.x-k8s.io/node=fake, so the real node is left alone.
# v0.6.1, not v0.7.0: v0.7.0's watches are refused by this API server (its etcd lacks the progress notifications
# they need), so its caches go stale, its lease renewals conflict, the leases expire and the node controller
# marks every pod on its nodes not ready.
KWOK_VERSION="${WS_KWOK_VERSION:-0.6.1}"
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
BIN="$CACHE/bin"
mkdir -p "$BIN"
log() { echo "[cluster/build.sh $(date -u +%H:%M:%S)] $*" >&2; }
trap 'log "FAILED at line $LINENO: $BASH_COMMAND"' ERR

# --- Debian packages (before the Go builds: they are quick and the node cannot start without them). ---
need_pkgs=()
have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" ]]; }
have containerd || need_pkgs+=(containerd)
have runc || need_pkgs+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
  || need_pkgs+=(containernetworking-plugins)
have iptables || need_pkgs+=(iptables)
have conntrack || need_pkgs+=(conntrack)
have ip || need_pkgs+=(iproute2)
have mount || need_pkgs+=(mount)
have curl || need_pkgs+=(curl)
have jq || need_pkgs+=(jq)
have openssl || need_pkgs+=(openssl)
have flock || need_pkgs+=(util-linux)
have ipset || need_pkgs+=(ipset)   # kube-router's policy controller drives ipsets through the ipset tool
if ((${#need_pkgs[@]})); then
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    log "missing ${need_pkgs[*]} and cannot apt-get them (needs root on Debian)"; exit 1
  fi
  log "installing ${need_pkgs[*]} with apt-get"
  (exec 8>/tmp/weightstream-apt.lock && flock -w 900 8 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need_pkgs[@]}") >&2
fi

# --- etcd and kube-apiserver (this also creates the wrapper module and sets up the Go caches there). ---
mapfile -t CORE < <(nice -n "${WS_NICE:-19}" "$HERE/../apiserver/build.sh")
[[ -x "${CORE[0]:-}" && -x "${CORE[1]:-}" ]] || { log "e2e/apiserver/build.sh named no usable binaries"; exit 1; }

# The same Go environment as e2e/apiserver/build.sh.
export GOCACHE="${GOCACHE:-$(go env GOCACHE 2>/dev/null || true)}"
[[ -n "$GOCACHE" && "$GOCACHE" != off ]] || export GOCACHE="$CACHE/go-build"
export GOMODCACHE="${GOMODCACHE:-$(go env GOMODCACHE 2>/dev/null || true)}"
[[ -n "$GOMODCACHE" ]] || export GOMODCACHE="$CACHE/go-mod"
[[ -n "${HOME:-}" ]] || export GOPATH="${GOPATH:-$CACHE/go}"

exec 9>"$CACHE/build.lock"
flock 9

W="$CACHE/k8s-wrapper-v$K8S_VERSION"
MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
done
CMDS=(kube-scheduler kube-proxy kubelet kube-controller-manager)
# kubectl is not needed by up.sh or the tests; WS_CLUSTER_KUBECTL=1 builds it too (for trying things by hand).
[[ -n "${WS_CLUSTER_KUBECTL:-}" ]] && CMDS+=(kubectl)
# More commands of the same module and version, built the same way (e2e/kind/build.sh: kubeadm, kubectl).
read -r -a extra <<<"${WS_K8S_EXTRA_CMDS:-}"
CMDS+=("${extra[@]}")
for cmd in "${CMDS[@]}"; do
  out="$BIN/$cmd-v$K8S_VERSION"
  [[ -x "$out" ]] && continue
  command -v go >/dev/null || { log "go is not installed: cannot build $cmd"; exit 1; }
  start=$(date +%s)
  log "building $cmd v$K8S_VERSION in $W"
  (cd "$W" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n "${WS_NICE:-19}" go build -trimpath -ldflags "$LD" \
    -o "$out.tmp" "k8s.io/kubernetes/cmd/$cmd" >&2)
  mv "$out.tmp" "$out"
  log "built $cmd in $(( $(date +%s) - start ))s"
done

COREDNS="$BIN/coredns-v$COREDNS_VERSION"
if [[ ! -x "$COREDNS" ]]; then
  start=$(date +%s)
  log "building CoreDNS v$COREDNS_VERSION (the plugins the clusters' Corefiles use)"
  # CoreDNS's own main imports every plugin it ships (cloud DNS providers, etcd, dnstap, …), most of its build
  # time; this one links only the plugins the local node's Corefile (up.sh) and kubeadm's default Corefile on
  # kind use, with CoreDNS's own coremain and directive order. The module's versions are CoreDNS's own (its
  # go.mod, by minimal version selection), checked by the checksum database.
  cw="$CACHE/coredns-wrapper-v$COREDNS_VERSION"
  mkdir -p "$cw"
  printf 'module ws-coredns\n\ngo 1.24.0\n\nrequire github.com/coredns/coredns v%s\n' "$COREDNS_VERSION" >"$cw/go.mod"
  {
    printf '// CoreDNS with the plugins the test clusters use (e2e/cluster/build.sh writes this file).\npackage main\n\nimport (\n'
    for p in bind cache errors forward health kubernetes loadbalance log loop metrics ready reload; do
      printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"
    done
    printf '\n\t"github.com/coredns/coredns/coremain"\n)\n\nfunc main() { coremain.Run() }\n'
  } >"$cw/main.go"
  (cd "$cw" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n "${WS_NICE:-19}" go build -trimpath -ldflags "-s -w" \
    -o "$COREDNS.tmp" . >&2)
  mv "$COREDNS.tmp" "$COREDNS"
  log "built CoreDNS in $(( $(date +%s) - start ))s"
fi

KUBE_ROUTER="$BIN/kube-router-v$KUBE_ROUTER_VERSION"
if [[ ! -x "$KUBE_ROUTER" ]]; then
  start=$(date +%s)
  log "building kube-router v$KUBE_ROUTER_VERSION"
  export GONOSUMDB="github.com/cloudnativelabs/kube-router/v2${GONOSUMDB:+,$GONOSUMDB}"
  mod="github.com/cloudnativelabs/kube-router/v2@v$KUBE_ROUTER_VERSION"
  sum="$(cd "$BIN" && go mod download -json "$mod" | jq -r '.Sum // empty')"
  [[ "$sum" == "$KUBE_ROUTER_SUM" ]] \
    || { log "kube-router v$KUBE_ROUTER_VERSION has hash '$sum', not the pinned $KUBE_ROUTER_SUM: refusing to build it"; exit 1; }
  # Built inside the downloaded module, with its own go.mod and go.sum (`go install pkg@version` would ask the
  # proxy for the module's version list, which it refuses).
  dir="$(cd "$BIN" && go mod download -json "$mod" | jq -r '.Dir')"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly nice -n "${WS_NICE:-19}" go build -C "$dir" -trimpath \
    -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v$KUBE_ROUTER_VERSION" \
    -o "$KUBE_ROUTER.tmp" ./cmd/kube-router >&2
  mv "$KUBE_ROUTER.tmp" "$KUBE_ROUTER"
  log "built kube-router in $(( $(date +%s) - start ))s"
fi

# kwok deletes a pod by its name alone, so a delete still queued for a pod that is gone removes its namesake,
# which an operator creates again at once (a rescale reuses every name): it is built with the pod's UID as the
# delete's precondition, as a kubelet deletes. The binary's name says so (a cached unpatched one is not reused).
KWOK="$BIN/kwok-v$KWOK_VERSION-uid"
if [[ ! -x "$KWOK" ]]; then
  start=$(date +%s)
  log "building kwok v$KWOK_VERSION (deletes with the pod's UID as precondition)"
  # The module's go.sum pins its dependencies; the checksum database vouches for the module itself. Built in a
  # writable copy of the downloaded module, with its own go.mod and go.sum.
  dir="$(cd "$BIN" && go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" | jq -r '.Dir')"
  src="$BIN/.kwok-src-$KWOK_VERSION"
  rm -rf "$src"
  cp -r "$dir" "$src"
  chmod -R u+w "$src"
  file="$src/pkg/kwok/controllers/pod_controller.go"
  grep -q 'Delete(ctx, pod.Name, deleteOpt)' "$file" \
    || { log "kwok v$KWOK_VERSION: its pod delete is not where this script patches it"; exit 1; }
  sed -i 's|Delete(ctx, pod.Name, deleteOpt)|Delete(ctx, pod.Name, deleteOfThisPod(pod))|' "$file"
  cat >>"$file" <<'GO'

// deleteOfThisPod is deleteOpt for this pod only: a namesake created since is left alone.
func deleteOfThisPod(pod *corev1.Pod) metav1.DeleteOptions {
	opt := deleteOpt
	opt.Preconditions = metav1.NewUIDPreconditions(string(pod.UID))
	return opt
}
GO
  CGO_ENABLED=0 GOFLAGS=-mod=readonly nice -n "${WS_NICE:-19}" go build -C "$src" -trimpath -ldflags "-s -w" \
    -o "$KWOK.tmp" ./cmd/kwok >&2
  mv "$KWOK.tmp" "$KWOK"
  rm -rf "$src"
  log "built kwok in $(( $(date +%s) - start ))s"
fi

echo "etcd=${CORE[0]}"
echo "kube-apiserver=${CORE[1]}"
for cmd in kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm; do
  [[ -x "$BIN/$cmd-v$K8S_VERSION" ]] && echo "$cmd=$BIN/$cmd-v$K8S_VERSION"
done
echo "coredns=$COREDNS"
echo "kube-router=$KUBE_ROUTER"
echo "kwok=$KWOK"
for b in containerd ctr runc iptables conntrack; do echo "$b=$(command -v "$b" || echo "/usr/sbin/$b")"; done
