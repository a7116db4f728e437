#!/usr/bin/env bash
# Installs the headless browser the dashboard's tests load pages in (Debian's chromium, from the Debian mirror:
# no download from elsewhere), once, and prints its path on stdout (nothing else goes to stdout):
#   CHROMIUM="$(bash e2e/tools/chromium.sh)" && "$CHROMIUM" --version
# The apt lock is the one the other set-up scripts share (/tmp/weightstream-apt.lock): CI runs them side by side.
set -euo pipefail
log() { echo "chromium.sh: $*" >&2; }

if ! command -v chromium >/dev/null; then
  [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null \
    || { log "chromium is needed (Debian: apt-get install chromium), and this is not root on Debian"; exit 1; }
  log "installing chromium with apt-get"
  (exec 8>/tmp/weightstream-apt.lock && flock -w 900 8 && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >&2
fi
command -v chromium
