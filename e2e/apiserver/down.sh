#!/usr/bin/env bash
# Stops the instance up.sh started (by its pid files) and, with --wipe, removes its etcd data.
set -euo pipefail
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
RUN="$CACHE/run/${WS_APISERVER_INSTANCE:-default}"
for p in kube-apiserver etcd; do
  if [[ -f "$RUN/$p.pid" ]]; then
    pid="$(cat "$RUN/$p.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$RUN/$p.pid"
  fi
done
if [[ "${1:-}" == "--wipe" ]]; then rm -rf "$RUN/etcd"; fi
