# Shared settings of e2e/cluster/{up,down}.sh (sourced, not run).
# Every name here is one the scripts create and remove again; change them together.

CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
RUN="${WS_CLUSTER_RUN_DIR:-$CACHE/cluster}"
NODE_NAME="ws-node"
BRIDGE="wsbr0"                 # the pod bridge; its address is also the node's (API server, kubelet, DNS)
POD_CIDR="10.244.0.0/24"
NODE_IP="10.244.0.1"
SERVICE_CIDR="10.96.0.0/16"
KUBERNETES_SVC_IP="10.96.0.1"
API_PORT=6443
ETCD_PORT=12379
ETCD_PEER_PORT=12380
KUBELET_ROOT="/var/lib/kubelet"  # the device-plugin socket dir is <root>/device-plugins; plugins expect this one
PV_ROOT="/tmp/weightstream-pv"   # the local volumes' directories (root-owned 0755; pods get them through fsGroup)
# Free disk below which the kubelet evicts and admits no pod. An absolute size, not a percentage: a percentage of
# a large disk whose blocks are mostly reserved for another user is more than the whole of what root may use.
EVICTION_FREE="512Mi"
PV_COUNT="${WS_CLUSTER_PV_COUNT:-48}"
FWD_CHAIN="WS-CLUSTER-FWD"       # keeps pod traffic on the bridge (pods never reach other networks)
CONTAINERD_SOCK="$RUN/containerd/containerd.sock"
# Processes in start order; down.sh stops them in reverse.
COMPONENTS=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet kube-proxy coredns kube-router kwok)
# The annotation that hands a Node (and the pods bound to it) to kwok: the scale tests' fake CS-2 hosts wear it.
KWOK_NODE_ANNOTATION="kwok.x-k8s.io/node=fake"

log() { echo "[cluster/$(basename "$0") $(date -u +%H:%M:%S)] $*" >&2; }
alive() { [[ -f "$RUN/pids/$1" ]] && kill -0 "$(cat "$RUN/pids/$1")" 2>/dev/null; }
