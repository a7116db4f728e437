#!/usr/bin/env bash
# Brings up a real single-node Kubernetes cluster from upstream parts on this machine (root, Linux, no Docker):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (iptables), CoreDNS as host
# processes, containerd + runc as the runtime, the CNI bridge plugin on a bridge of our own. The node's address is
# the bridge's (10.244.0.1), so every server listens on loopback or on that bridge and pods cannot reach other
# networks. Images come from ${WS_IMAGES_DIR:-target/images}/*.tar (the pause image among them), imported into
# containerd; nothing is pulled.
#
#   bash e2e/cluster/up.sh      # prints the admin kubeconfig's path on stdout; logs go to stderr and $RUN/logs
#   bash e2e/cluster/down.sh    # stops it all and removes what up.sh made
#
# Idempotent: when the cluster already answers and its node is Ready, it re-imports any changed image tarballs,
# tops up the volume pool and prints the kubeconfig path again.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
IMAGES="${WS_IMAGES_DIR:-$ROOT/target/images}"
trap 'log "FAILED at line $LINENO: $BASH_COMMAND (logs in $RUN/logs)"' ERR

[[ "$(id -u)" == 0 ]] || { log "must run as root (kubelet, containerd, iptables, mounts)"; exit 1; }
mkdir -p "$RUN/pids" "$RUN/logs"
exec 8>"$RUN/up.lock"
flock 8

KC="$RUN/kubeconfigs"
PKI="$RUN/pki"
API="https://$NODE_IP:$API_PORT"

# curl against the API server as admin: api METHOD PATH [curl args...]
api() {
  local method="$1" path="$2"
  shift 2
  curl -sS --fail-with-body --max-time 20 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(cat "$RUN/admin.token")" \
    -X "$method" "$API$path" "$@"
}
# Server-side apply of the YAML on stdin to PATH.
apply() {
  api PATCH "$1?fieldManager=ws-cluster-up&force=true" -H 'Content-Type: application/apply-patch+yaml' \
    --data-binary @- >/dev/null
}
api_ready() { [[ -f "$RUN/admin.token" ]] && api GET /readyz >/dev/null 2>&1; }
node_ready() {
  api GET "/api/v1/nodes/$NODE_NAME" 2>/dev/null \
    | jq -e '.status.conditions[] | select(.type == "Ready" and .status == "True")' >/dev/null 2>&1
}
# wait_until SECONDS WHAT COMPONENT CMD...: polls CMD every 0.5 s; fails with COMPONENT's log if it dies or time runs out.
wait_until() {
  local secs="$1" what="$2" comp="$3"
  shift 3
  local i
  for ((i = 0; i < secs * 2; i++)); do
    if "$@"; then return 0; fi
    if [[ -n "$comp" ]] && ! alive "$comp"; then
      log "$comp exited while waiting for $what; the end of $RUN/logs/$comp.log:"
      tail -25 "$RUN/logs/$comp.log" >&2
      return 1
    fi
    sleep 0.5
  done
  log "timed out after ${secs}s waiting for $what; the end of $RUN/logs/$comp.log:"
  [[ -n "$comp" ]] && tail -25 "$RUN/logs/$comp.log" >&2
  return 1
}
# start NAME CMD...: runs CMD in its own session, logging to $RUN/logs/NAME.log, and records its pid.
start() {
  local name="$1"
  shift
  if alive "$name"; then return 0; fi
  log "starting $name"
  setsid "$@" >>"$RUN/logs/$name.log" 2>&1 </dev/null 8>&- &
  echo $! >"$RUN/pids/$name"
}

# The pause image: the one tarball under $IMAGES whose tag names pause.
image_tags() {
  # docker-archive (manifest.json RepoTags) or OCI layout (index.json ref annotations).
  # (members may be stored as "./name" or "name")
  { tar -xOf "$1" manifest.json ./manifest.json 2>/dev/null | jq -r '.[].RepoTags[]?' 2>/dev/null || true
    tar -xOf "$1" index.json ./index.json 2>/dev/null \
      | jq -r '.manifests[].annotations["io.containerd.image.name"] // empty' 2>/dev/null || true; } | sort -u
}
import_images() {
  local t tag stamp="$RUN/imported"
  touch "$stamp.list"
  shopt -s nullglob
  for t in "$IMAGES"/*.tar; do
    local sum
    sum="$(stat -c '%s %Y' "$t") $t"
    grep -qxF "$sum" "$stamp.list" && continue
    log "importing $(basename "$t") into containerd"
    ctr --address "$CONTAINERD_SOCK" -n k8s.io images import "$t" >>"$RUN/logs/images.log" 2>&1 \
      || { log "ctr images import $t failed:"; tail -5 "$RUN/logs/images.log" >&2; return 1; }
    echo "$sum" >>"$stamp.list"
  done
  shopt -u nullglob
}
pv_pool() {
  # Statically provisioned `local` volumes, bound to claims of the default class. Unlike hostPath, the kubelet
  # applies a pod's fsGroup to a local volume (group-owned, setgid, group-writable), so MemoryX (uid 65532)
  # writes its checkpoints into a root-owned 0755 directory that nobody else may write: nothing world-writable.
  # A local volume must name its node (nodeAffinity). Without a provisioner nothing can delete a local volume's
  # data, so the reclaim policy is Retain and this function recycles: a Released volume (its claim is gone) is
  # emptied, given back to root with 0755, and its claimRef cleared, which makes it Available again. Every up.sh
  # run recycles and tops the pool up.
  local i name have released
  released="$(api GET /api/v1/persistentvolumes?labelSelector=weightstream.dev/e2e-pool%3Dtrue \
    | jq -r '.items[] | select(.status.phase == "Released") | .metadata.name + " " + .spec.local.path')"
  while read -r name path; do
    [[ -n "$name" && "$path" == "$PV_ROOT/"* ]] || continue
    find "$path" -mindepth 1 -delete
    chown 0:0 "$path" && chmod u=rwx,go=rx,g-s "$path"
    api PATCH "/api/v1/persistentvolumes/$name" -H 'Content-Type: application/merge-patch+json' \
      --data '{"spec":{"claimRef":null}}' >/dev/null
    log "recycled volume $name"
  done <<<"$released"
  have="$(api GET /api/v1/persistentvolumes | jq -r '.items[].metadata.name')"
  for ((i = 0; i < PV_COUNT; i++)); do
    name="$(printf 'ws-pv-%02d' "$i")"
    grep -qxF "$name" <<<"$have" && continue
    mkdir -p "$PV_ROOT/$name"
    chown 0:0 "$PV_ROOT/$name" && chmod 0755 "$PV_ROOT/$name"
    apply "/api/v1/persistentvolumes/$name" <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $name, labels: {weightstream.dev/e2e-pool: "true"}}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ws-local
  local: {path: $PV_ROOT/$name}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [$NODE_NAME]}
YAML
  done
}

if alive etcd && alive kube-apiserver && alive kubelet && alive kube-router && alive kwok && api_ready && node_ready; then
  import_images
  pv_pool
  echo "$KC/admin.kubeconfig"
  exit 0
fi

# The kubelet refuses every pod while its disk is under the eviction threshold (DiskPressure), and Helm then only
# says "context deadline exceeded": say it here, with what to free, before anything starts. (Only on a cold start: a
# running cluster keeps running until the kubelet's own threshold, and later test binaries reuse it.)
MIN_FREE_MIB="${WS_CLUSTER_MIN_FREE_MIB:-2048}"
for dir in "$RUN" "$(dirname "$KUBELET_ROOT")" "$(dirname "$PV_ROOT")"; do
  free_mib="$(df -Pm "$dir" | awk 'NR == 2 {print $4}')"
  if (( free_mib < MIN_FREE_MIB )); then
    log "only ${free_mib} MiB free on the filesystem of $dir; the cluster needs ${MIN_FREE_MIB} MiB" \
      "(the kubelet refuses pods below ${EVICTION_FREE}): free some (old target/ folders, /tmp) and run again"
    exit 1
  fi
done
T0=$(date +%s)
# --- binaries ---
if ! "$HERE/build.sh" >"$RUN/binaries"; then
  log "building or installing the binaries failed (see the build.sh lines above)"; exit 1
fi
declare -A B
while IFS='=' read -r k v; do B[$k]="$v"; done <"$RUN/binaries"
for k in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns kube-router kwok containerd ctr runc; do
  [[ -x "${B[$k]:-}" ]] || { log "build.sh named no usable $k: '${B[$k]:-}'"; exit 1; }
done
PATH="$(dirname "${B[ctr]}"):$PATH"
command -v jq >/dev/null || { log "jq is missing (build.sh installs it)"; exit 1; }

PAUSE_TAR="$(ls "$IMAGES"/*pause*.tar 2>/dev/null | head -n1 || true)"
[[ -n "$PAUSE_TAR" ]] || { log "no pause image tarball (*pause*.tar) in $IMAGES: run 'bash images/build.sh' first"; exit 1; }
PAUSE_IMAGE="$(image_tags "$PAUSE_TAR" | head -n1 || true)"
[[ -n "$PAUSE_IMAGE" ]] || { log "cannot read the image tag of $PAUSE_TAR"; exit 1; }
# containerd stores docker.io-less names fully qualified.
[[ "$PAUSE_IMAGE" == */*/* || "$PAUSE_IMAGE" == *.*/* ]] || PAUSE_IMAGE="docker.io/$PAUSE_IMAGE"
[[ "$PAUSE_IMAGE" == */* ]] || PAUSE_IMAGE="docker.io/library/$PAUSE_IMAGE"

# A half-started earlier run: stop it first so every component starts from the same state.
if ls "$RUN/pids/"* >/dev/null 2>&1; then
  log "an earlier run is partly up: stopping it first"
  bash "$HERE/down.sh" --keep-logs
fi
mkdir -p "$RUN/pids" "$RUN/logs"

# --- host networking: the bridge (the node's address), forwarding, bridged traffic through iptables ---
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
fi
ip addr replace "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
ip link set "$BRIDGE" up
sysctl -qw net.ipv4.ip_forward=1
# Pod-to-pod traffic is bridged, so without br_netfilter it never meets iptables: neither kube-proxy's Service
# rules nor kube-router's NetworkPolicy rules would see it. Required.
[[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] || modprobe br_netfilter 2>/dev/null || true
if [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
  sysctl -qw net.bridge.bridge-nf-call-iptables=1
else
  log "no br_netfilter (modprobe br_netfilter failed): bridged pod traffic would bypass iptables, so NetworkPolicy could not be enforced"
  exit 1
fi
iptables -N "$FWD_CHAIN" 2>/dev/null || iptables -F "$FWD_CHAIN"
iptables -A "$FWD_CHAIN" -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
iptables -A "$FWD_CHAIN" -i "$BRIDGE" -j DROP
iptables -A "$FWD_CHAIN" -o "$BRIDGE" -j DROP
iptables -C FORWARD -j "$FWD_CHAIN" 2>/dev/null || iptables -I FORWARD 1 -j "$FWD_CHAIN"

# --- credentials: a CA, the API server's serving and kubelet-client certificates, the service-account key, a
# token per component (token auth keeps the kubeconfigs free of client certificates) ---
if [[ ! -f "$PKI/apiserver.crt" || ! -f "$RUN/tokens.csv" || ! -f "$KC/kwok.kubeconfig" ]]; then
  mkdir -p "$PKI"
  (
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=weightstream-cluster-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    sign() { # sign NAME SUBJECT EXTENSIONS
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      printf '%b' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 \
        -extfile "$1.ext" 2>/dev/null
    }
    sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:$NODE_IP,IP:$KUBERNETES_SVC_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
    sign kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    sign kubelet "/CN=$NODE_NAME" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:$NODE_IP,DNS:$NODE_NAME\n"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  : >"$RUN/tokens.csv"
  tok() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
  t="$(tok)"; echo "$t" >"$RUN/admin.token"
  echo "$t,admin,admin,system:masters" >>"$RUN/tokens.csv"
  mkdir -p "$KC"
  # kubeconfig FILE USER TOKEN
  kubeconfig() {
    cat >"$KC/$1.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: weightstream-local
  cluster: {server: "$API", certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")}
users:
- name: $2
  user: {token: $3}
contexts:
- name: weightstream-local
  context: {cluster: weightstream-local, user: $2}
current-context: weightstream-local
YAML
    chmod 0600 "$KC/$1.kubeconfig"
  }
  kubeconfig admin admin "$t"
  for triple in "kube-controller-manager|system:kube-controller-manager|" "kube-scheduler|system:kube-scheduler|" \
      "kube-proxy|system:kube-proxy|" "kubelet|system:node:$NODE_NAME|system:nodes" "coredns|ws-coredns|" "kube-router|ws-kube-router|" "kwok|ws-kwok|"; do
    IFS='|' read -r file user group <<<"$triple"
    t="$(tok)"
    if [[ -n "$group" ]]; then echo "$t,$user,$user,$group" >>"$RUN/tokens.csv"; else echo "$t,$user,$user" >>"$RUN/tokens.csv"; fi
    kubeconfig "$file" "$user" "$t"
  done
fi

# The aggregation layer's front proxy (extension API servers such as Kueue's visibility API trust the API server
# by this client certificate, signed by a CA of its own).
if [[ ! -f "$PKI/front-proxy-client.crt" ]]; then
  (
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 \
      -subj "/CN=weightstream-front-proxy-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
      -subj "/CN=front-proxy-client" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' \
      >front-proxy-client.ext
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
      -out front-proxy-client.crt -days 3650 -extfile front-proxy-client.ext 2>/dev/null
  )
fi

# --- etcd ---
start etcd "${B[etcd]}" --name ws-cluster --data-dir "$RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "ws-cluster=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
  --quota-backend-bytes 2147483648
wait_until 30 "etcd" etcd curl -sf --max-time 1 "http://127.0.0.1:$ETCD_PORT/health" -o /dev/null

# --- kube-apiserver, on the node's address only ---
start kube-apiserver "${B[kube-apiserver]}" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
  --kubelet-client-certificate "$PKI/kubelet-client.crt" --kubelet-client-key "$PKI/kubelet-client.key" \
  --token-auth-file "$RUN/tokens.csv" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true --profiling=false \
  --kubelet-preferred-address-types InternalIP \
  --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key" \
  --enable-aggregator-routing=true
wait_until 90 "kube-apiserver /readyz" kube-apiserver api_ready

# --- cluster objects the node needs: CoreDNS's read access, the default StorageClass and its volumes ---
apply /apis/rbac.authorization.k8s.io/v1/clusterroles/ws-coredns <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ws-coredns}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
YAML
apply /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/ws-coredns <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ws-coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ws-coredns}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: ws-coredns}
YAML
# kube-router's network-policy controller reads what policies select and never writes.
apply /apis/rbac.authorization.k8s.io/v1/clusterroles/ws-kube-router <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ws-kube-router}
rules:
- apiGroups: [""]
  resources: [nodes, pods, namespaces, services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
YAML
apply /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/ws-kube-router <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ws-kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ws-kube-router}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: ws-kube-router}
YAML
apply /apis/storage.k8s.io/v1/storageclasses/ws-local <<'YAML'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: ws-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
reclaimPolicy: Retain
volumeBindingMode: WaitForFirstConsumer
YAML
pv_pool

# --- containerd: its own config, root, state and socket; CNI config of our own ---
mkdir -p "$RUN/containerd" "$RUN/cni/net.d"
cat >"$RUN/cni/net.d/10-weightstream.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "weightstream-pods",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$RUN/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
JSON
cat >"$RUN/containerd/config.toml" <<TOML
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Clamp every container's oom_score_adj to containerd's own (0) at least: this VM's root has no
  # CAP_SYS_RESOURCE, so the kubelet's negative scores (sandboxes -998, Guaranteed pods -997) make runc fail
  # with "failed to update /proc/self/oom_score_adj: Permission denied".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "${B[runc]}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
    max_conf_num = 1
TOML
start containerd "${B[containerd]}" --config "$RUN/containerd/config.toml"
containerd_up() { ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1; }
wait_until 30 "containerd" containerd containerd_up
: >"$RUN/imported.list"
import_images
# (the list is read whole first: with pipefail, grep -q stopping early would fail the pipeline through SIGPIPE)
LOADED="$(ctr --address "$CONTAINERD_SOCK" -n k8s.io images ls -q)"
grep -qxF "$PAUSE_IMAGE" <<<"$LOADED" \
  || { log "the pause image $PAUSE_IMAGE is not in containerd after the import; it has: $LOADED"; exit 1; }

# --- controller-manager and scheduler. A node is deemed lost after 5 minutes without a heartbeat, not 50 s: on
# this shared 2-core machine kwok's 48 fake nodes (e2e/tests/scale.rs) can miss their lease renewals for a while
# under load, and the node controller would then mark every pod on them not ready. ---
start kube-controller-manager "${B[kube-controller-manager]}" \
  --kubeconfig "$KC/kube-controller-manager.kubeconfig" \
  --authentication-kubeconfig "$KC/kube-controller-manager.kubeconfig" \
  --authorization-kubeconfig "$KC/kube-controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --cluster-name weightstream-local --profiling=false \
  --node-monitor-grace-period=5m
start kube-scheduler "${B[kube-scheduler]}" \
  --kubeconfig "$KC/kube-scheduler.kubeconfig" \
  --authentication-kubeconfig "$KC/kube-scheduler.kubeconfig" \
  --authorization-kubeconfig "$KC/kube-scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false --profiling=false

# --- CoreDNS on the node's address: cluster.local only (it forwards nothing, so no query leaves the machine) ---
mkdir -p "$RUN/coredns"
cat >"$RUN/coredns/Corefile" <<CORE
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $NODE_IP
    errors
    ready 127.0.0.1:18181
    health 127.0.0.1:18080
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KC/coredns.kubeconfig weightstream-local
        pods insecure
        ttl 1
    }
}
CORE
start coredns "${B[coredns]}" -conf "$RUN/coredns/Corefile"

# --- kubelet (cgroupfs on cgroup v1, no swap check, images never collected) and kube-proxy (iptables) ---
mkdir -p "$RUN/kubelet"
cat >"$RUN/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
clusterDomain: cluster.local
clusterDNS: [$NODE_IP]
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: "$EVICTION_FREE", nodefs.inodesFree: "1%", imagefs.available: "$EVICTION_FREE"}
serializeImagePulls: false
maxPods: 110
registerNode: true
oomScoreAdj: 0
YAML
start kubelet "${B[kubelet]}" --config "$RUN/kubelet/config.yaml" \
  --kubeconfig "$KC/kubelet.kubeconfig" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
  --root-dir "$KUBELET_ROOT" --cert-dir "$RUN/kubelet/pki"

cat >"$RUN/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KC/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
oomScoreAdj: 0
YAML
start kube-proxy "${B[kube-proxy]}" --config "$RUN/kube-proxy.yaml"

wait_until 60 "CoreDNS /ready" coredns curl -sf --max-time 1 http://127.0.0.1:18181/ready -o /dev/null
wait_until 120 "node $NODE_NAME to be Ready" kubelet node_ready

# --- kube-router, its network-policy controller only (iptables + ipset; no routing, no service proxy, no CNI
# config: the bridge plugin stays the CNI): it reads the Node object, so it starts once the node is registered.
# Its health and metrics servers are off (they would listen on every interface). kube-proxy also inserts jumps
# at the head of FORWARD, and kube-router puts its own back in front only on a sync: it syncs every 15 s (not
# every 5 minutes), so whichever starts first, the policy leads FORWARD within seconds. ---
start kube-router "${B[kube-router]}" --kubeconfig "$KC/kube-router.kubeconfig" --hostname-override "$NODE_NAME" \
  --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
  --service-cluster-ip-range "$SERVICE_CIDR" --health-port=0 --metrics-port=0 --iptables-sync-period=15s
# Enforcing once its jump leads FORWARD (ahead of $FWD_CHAIN, which accepts bridge-to-bridge traffic).
policy_enforced() { [[ "$(iptables -S FORWARD 2>/dev/null | sed -n 2p)" == *"-j KUBE-ROUTER-FORWARD"* ]]; }
wait_until 60 "kube-router's policy chains at the head of FORWARD" kube-router policy_enforced

# --- kwok: plays node and kubelet for the nodes annotated $KWOK_NODE_ANNOTATION (none until a scale test adds
# its fake CS-2 hosts; the real node is not its). It keeps their leases and Ready condition and marks the pods
# bound to them Running and Ready, from each node's podCIDR. Its own API server (logs, exec) stays off. ---
apply /apis/rbac.authorization.k8s.io/v1/clusterroles/ws-kwok <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ws-kwok}
rules:
- {apiGroups: [""], resources: [nodes, pods], verbs: [get, list, watch, update, patch, delete]}
- {apiGroups: [""], resources: [nodes/status, pods/status], verbs: [get, update, patch]}
- {apiGroups: [""], resources: [events], verbs: [create, update, patch]}
- {apiGroups: [events.k8s.io], resources: [events], verbs: [create, update, patch]}
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, create, update, patch, delete]}
YAML
apply /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/ws-kwok <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ws-kwok}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ws-kwok}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: ws-kwok}
YAML
start kwok "${B[kwok]}" --kubeconfig "$KC/kwok.kubeconfig" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector="$KWOK_NODE_ANNOTATION" \
  --node-lease-duration-seconds=40 --cidr=10.128.0.1/16
for c in kube-controller-manager kube-scheduler kube-proxy kwok; do alive "$c" || { log "$c exited:"; tail -20 "$RUN/logs/$c.log" >&2; exit 1; }; done

# --- a pod really runs: the pause image in the default namespace (its ServiceAccount comes from the
# controller-manager, so the first tries may be refused) ---
smoke() {
  apply /api/v1/namespaces/default/pods/ws-smoke 2>/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: ws-smoke}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  containers:
  - {name: pause, image: $PAUSE_IMAGE, imagePullPolicy: Never}
YAML
}
wait_until 60 "the smoke pod to be accepted" kube-controller-manager smoke
smoke_running() {
  api GET /api/v1/namespaces/default/pods/ws-smoke 2>/dev/null \
    | jq -e '.status.phase == "Running" and (.status.podIP // "" | startswith("10.244."))' >/dev/null
}
if ! wait_until 120 "the smoke pod to run" kubelet smoke_running; then
  api GET /api/v1/namespaces/default/pods/ws-smoke | jq '.status' >&2 || true
  exit 1
fi
api DELETE "/api/v1/namespaces/default/pods/ws-smoke?gracePeriodSeconds=0" >/dev/null
log "cluster up in $(( $(date +%s) - T0 ))s: node $NODE_NAME Ready, a pod ran; kubeconfig $KC/admin.kubeconfig"
echo "$KC/admin.kubeconfig"
