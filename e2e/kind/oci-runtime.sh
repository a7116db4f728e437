#!/usr/bin/env bash
# An OCI runtime for Docker that is runc less one capability: it removes every capability the host's bounding
# set lacks from the spec a container or an exec is started with, then hands over to runc unchanged.
#
# Why: kind starts its nodes with `docker run --privileged`, which asks for every capability. A host whose bounding
# set lacks one (this CI machine lacks CAP_SYS_RESOURCE) makes runc fail with "unable to apply caps: operation not
# permitted", although the node needs none of them. e2e/kind/docker.sh registers this file as its dockerd's
# default runtime; nothing else about the container changes.
#
# Called as runc is: `oci-runtime.sh [global options] COMMAND [options] [ID]`. Only two commands carry
# capabilities: `create`/`run` (in BUNDLE/config.json, BUNDLE from --bundle/-b, else the working directory) and
# `exec` (in the --process/-p file). Each file is rewritten in place before runc reads it.
set -euo pipefail

RUNC="${WS_OCI_RUNC:-$(command -v runc)}"

# The capabilities the bounding set of this process has, as the JSON array of OCI names ("CAP_CHOWN", …).
bounding_set() {
  local mask i names=()
  mask=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  local all=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE
    NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE
    SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL
    SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE)
  for i in "${!all[@]}"; do
    ((mask >> i & 1)) && names+=("\"CAP_${all[$i]}\"")
  done
  local IFS=,
  echo "[${names[*]}]"
}

# Keeps in each capability list of the process object at jq path $2 of file $1 ("" for the whole file) only
# what the host can grant.
clamp() {
  local file="$1" path="$2" tmp
  [[ -f "$file" ]] || return 0
  tmp="$(mktemp "$file.XXXXXX")"
  jq --argjson host "$(bounding_set)" \
    "($path.capabilities // {}) |= with_entries(.value |= map(select(. as \$c | \$host | index(\$c))))" \
    "$file" >"$tmp"
  mv "$tmp" "$file"
}

args=("$@")
command="" bundle="" process=""
for ((i = 0; i < ${#args[@]}; i++)); do
  a="${args[$i]}"
  if [[ -z "$command" ]]; then
    case "$a" in
      create | run | exec) command="$a" ;;
      --root | --log | --log-format | --criu | --rootless) ((i += 1)) ;;
    esac
    continue
  fi
  case "$a" in
    --bundle | -b) bundle="${args[$((i + 1))]:-}"; ((i += 1)) ;;
    --bundle=*) bundle="${a#--bundle=}" ;;
    --process | -p) process="${args[$((i + 1))]:-}"; ((i += 1)) ;;
    --process=*) process="${a#--process=}" ;;
  esac
done
case "$command" in
  create | run) clamp "${bundle:-.}/config.json" .process ;;
  exec) [[ -z "$process" ]] || clamp "$process" "" ;;
esac
exec "$RUNC" "$@"
