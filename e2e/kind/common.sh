# Shared settings of e2e/kind/{docker,build,up,down}.sh (sourced, not run): where the suite's Docker daemon and
# the cluster's files live, and the log line. Every name here is one the scripts create and remove again.

CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
CLUSTER="${WS_KIND_CLUSTER:-weightstream}"
DOCKER_DIR="$CACHE/docker"
DOCKER_SOCK="$DOCKER_DIR/docker.sock"
log() { echo "[kind/$(basename "$0") $(date -u +%H:%M:%S)] $*" >&2; }
