#!/usr/bin/env bash
# Stops the cluster e2e/cluster/up.sh started and removes what it made: its processes (by pid file), every pod's
# container and shim, mounts under the run dir and the kubelet's root, the pods' network namespaces, the bridge,
# the iptables chains of kube-proxy, kube-router, the kubelet and up.sh, kube-router's ipsets, the kubelet's
# cgroups, the volume pool and all state.
# The logs stay in $RUN/logs. Safe to run when nothing is up.
#
#   bash e2e/cluster/down.sh               # everything, logs kept
#   bash e2e/cluster/down.sh --keep-logs   # the same (the default; accepted for symmetry)
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
[[ "$(id -u)" == 0 ]] || { log "must run as root"; exit 1; }
[[ -d "$RUN" ]] || exit 0

stop() { # stop NAME: TERM, then KILL after 10 s
  local f="$RUN/pids/$1" pid i
  [[ -f "$f" ]] || return 0
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$f"
}

# 1. The node first (so nothing restarts containers), then every container through our containerd.
for c in kwok kube-router kube-proxy kubelet kube-scheduler kube-controller-manager coredns; do stop "$c"; done
NETNS=()
if alive containerd && command -v ctr >/dev/null; then
  CTR=(ctr --address "$CONTAINERD_SOCK" -n k8s.io)
  # The pods' network namespaces, read from the sandboxes' specs before they go.
  for id in $("${CTR[@]}" containers ls -q 2>/dev/null); do
    while read -r ns; do NETNS+=("$ns"); done < <("${CTR[@]}" containers info "$id" 2>/dev/null \
      | jq -r '.Spec.linux.namespaces[]? | select(.type == "network") | .path // empty' 2>/dev/null)
  done
  for id in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1; done
  for ((i = 0; i < 50; i++)); do
    running="$("${CTR[@]}" tasks ls 2>/dev/null | awk 'NR > 1 && $3 != "STOPPED"' | wc -l)"
    ((running == 0)) && break
    sleep 0.2
  done
  for id in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks delete -f "$id" >/dev/null 2>&1; done
  for id in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers delete "$id" >/dev/null 2>&1; done
fi
stop containerd
# Shims of our containerd that outlived it (a shim names its containerd's socket on its command line).
for p in /proc/[0-9]*; do
  cmd="$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null)" || continue
  if [[ "$cmd" == *containerd-shim*"$CONTAINERD_SOCK"* ]]; then kill -9 "${p#/proc/}" 2>/dev/null; fi
done
for c in kube-apiserver etcd; do stop "$c"; done

# 2. Mounts: container root filesystems, sandbox shm, pod volumes; deepest first.
for pass in 1 2 3; do
  mapfile -t MOUNTS < <(findmnt -rn -o TARGET | grep -E "^($RUN|$KUBELET_ROOT)(/|$)" | sort -r)
  ((${#MOUNTS[@]})) || break
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || { ((pass == 3)) && umount -l "$m" 2>/dev/null; }; done
done
for ns in "${NETNS[@]}"; do
  [[ "$ns" == /var/run/netns/cni-* || "$ns" == /run/netns/cni-* ]] || continue
  umount "$ns" 2>/dev/null; rm -f "$ns"
done

# 3. Network: the bridge (its veths went with the namespaces), iptables chains.
ip link del "$BRIDGE" 2>/dev/null
ipt_clean() { # ipt_clean IPTABLES: drops rules that jump to our chains from the built-in ones, then the chains
  local ipt="$1" table chain rule
  command -v "$ipt" >/dev/null || return 0
  for table in filter nat mangle; do
    for chain in $("$ipt" -t "$table" -S 2>/dev/null | awk '/^-P /{print $2}'); do
      "$ipt" -t "$table" -S "$chain" 2>/dev/null | grep -E -- "-j ($FWD_CHAIN|KUBE-[A-Z0-9-]+)( |$)" \
        | while read -r rule; do eval "$ipt -t $table ${rule/-A /-D }" 2>/dev/null; done
    done
    for chain in $("$ipt" -t "$table" -S 2>/dev/null | awk -v w="$FWD_CHAIN" '/^-N /{ if ($2 == w || $2 ~ /^KUBE-/) print $2 }'); do
      "$ipt" -t "$table" -F "$chain" 2>/dev/null
    done
    for chain in $("$ipt" -t "$table" -S 2>/dev/null | awk -v w="$FWD_CHAIN" '/^-N /{ if ($2 == w || $2 ~ /^KUBE-/) print $2 }'); do
      "$ipt" -t "$table" -X "$chain" 2>/dev/null
    done
  done
}
ipt_clean iptables
ipt_clean ip6tables
# kube-router's ipsets (KUBE-SRC-*, KUBE-DST-*, kube-router-*, and their inet6: twins), now that no rule uses them.
if command -v ipset >/dev/null; then
  ipset list -n 2>/dev/null | grep -E '^(inet6:)?(KUBE-|kube-router-)' | while read -r set; do ipset destroy "$set" 2>/dev/null; done
fi
# kube-proxy's own clean-up covers what it wrote in the other backends (nftables, ipvs), if anything.
if [[ -f "$RUN/binaries" ]]; then
  KP="$(sed -n 's/^kube-proxy=//p' "$RUN/binaries")"
  [[ -x "$KP" ]] && "$KP" --cleanup >>"$RUN/logs/kube-proxy-cleanup.log" 2>&1
fi

# 4. The kubelet's cgroups (empty now that every container is gone), deepest first.
for h in /sys/fs/cgroup/*/; do
  [[ -d "$h/kubepods" ]] || continue
  find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null
done

# 5. State: everything but the logs; the kubelet's root; the volume pool.
find "$RUN" -mindepth 1 -maxdepth 1 ! -name logs ! -name binaries ! -name up.lock -exec rm -rf {} + 2>/dev/null
rm -rf "$KUBELET_ROOT" "$PV_ROOT" /tmp/hostpath_provisioner 2>/dev/null
log "down: nothing of the cluster runs; logs stay in $RUN/logs"
exit 0
