# Shared settings of e2e/kind/{docker,build,up,down}.sh (sourced, not run): where the suite's Docker daemon and
# the cluster's files live, and the log line. Every name here is one the scripts create and remove again.

CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
CLUSTER="${WS_KIND_CLUSTER:-weightstream}"
# The host folder every node mounts at the same path, where the storage provisioner makes volumes: a volume's
# path in its PersistentVolume is also where the host finds its files.
VOLUMES="$CACHE/kind/$CLUSTER-volumes"
DOCKER_DIR="$CACHE/docker"
DOCKER_SOCK="$DOCKER_DIR/docker.sock"
log() { echo "[kind/$(basename "$0") $(date -u +%H:%M:%S)] $*" >&2; }
