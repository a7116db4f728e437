#!/usr/bin/env bash
# Starts a Kubernetes API server (kube-apiserver + etcd on loopback, no kubelet, no controller-manager) for the
# integration tests, building or installing the binaries first when the cache lacks them (see build.sh).
# Idempotent: when the instance already answers, it only prints the kubeconfig path again.
#
#   e2e/apiserver/up.sh            # prints the kubeconfig path on stdout; logs go to stderr and $RUN/*.log
#   WS_APISERVER_INSTANCE=other WS_APISERVER_PORT_OFFSET=1 e2e/apiserver/up.sh   # a second, separate instance
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${WS_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weightstream}"
INSTANCE="${WS_APISERVER_INSTANCE:-default}"
OFFSET="${WS_APISERVER_PORT_OFFSET:-0}"
RUN="$CACHE/run/$INSTANCE"
ETCD_PORT=$((23790 + 10 * OFFSET))
PEER_PORT=$((23791 + 10 * OFFSET))
API_PORT=$((26443 + OFFSET))
mkdir -p "$RUN"
log() { echo "[up.sh $INSTANCE $(date -u +%H:%M:%S)] $*" >&2; }

exec 8>"$RUN/up.lock"
flock 8

ready() {
  [[ -f "$RUN/token" ]] && curl -ksf --max-time 2 -H "Authorization: Bearer $(cat "$RUN/token")" \
    "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1
}
alive() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

if alive etcd && alive kube-apiserver && ready; then
  echo "$RUN/kubeconfig"
  exit 0
fi

if ! "$HERE/build.sh" > "$RUN/binaries"; then
  log "building or installing etcd and kube-apiserver failed (see the build.sh lines above)"
  exit 1
fi
mapfile -t BINS < "$RUN/binaries"
ETCD="${BINS[0]:-}"
APISERVER="${BINS[1]:-}"
if [[ ! -x "$ETCD" || ! -x "$APISERVER" ]]; then
  log "build.sh named no usable binaries: '$ETCD' '$APISERVER'"
  exit 1
fi

# Credentials: a CA, a serving certificate for 127.0.0.1/localhost, a service-account key and an admin token.
if [[ ! -f "$RUN/pki/server.crt" ]]; then
  mkdir -p "$RUN/pki"
  (
    cd "$RUN/pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=weightstream-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,IP:10.96.0.1\n' > server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 3650 \
      -extfile server.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$RUN/token"
  echo "$(cat "$RUN/token"),admin,admin,system:masters" > "$RUN/tokens.csv"
fi

# Stop leftovers of an earlier run of this instance (only the processes this script started, by pid file).
for p in kube-apiserver etcd; do
  if alive "$p"; then kill "$(cat "$RUN/$p.pid")" 2>/dev/null || true; sleep 1; fi
done

log "starting etcd ($ETCD) on 127.0.0.1:$ETCD_PORT"
setsid "$ETCD" --name ws-e2e --data-dir "$RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "ws-e2e=http://127.0.0.1:$PEER_PORT" --listen-metrics-urls "" \
  >"$RUN/etcd.log" 2>&1 < /dev/null 8>&- &
echo $! > "$RUN/etcd.pid"
for _ in $(seq 1 100); do
  curl -sf --max-time 1 "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 && break
  sleep 0.2
done

log "starting kube-apiserver ($APISERVER) on 127.0.0.1:$API_PORT"
setsid "$APISERVER" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" --etcd-prefix "/registry-ws-$INSTANCE" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
  --tls-cert-file "$RUN/pki/server.crt" --tls-private-key-file "$RUN/pki/server.key" \
  --client-ca-file "$RUN/pki/ca.crt" --token-auth-file "$RUN/tokens.csv" --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$RUN/pki/sa.pub" \
  --service-account-signing-key-file "$RUN/pki/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
  --disable-admission-plugins ServiceAccount --cert-dir "$RUN/pki" \
  --enable-priority-and-fairness=false --profiling=false \
  >"$RUN/kube-apiserver.log" 2>&1 < /dev/null 8>&- &
echo $! > "$RUN/kube-apiserver.pid"

for i in $(seq 1 300); do
  if ready; then break; fi
  if ! alive kube-apiserver; then
    log "kube-apiserver exited; the end of $RUN/kube-apiserver.log:"; tail -20 "$RUN/kube-apiserver.log" >&2; exit 1
  fi
  if [[ $i == 300 ]]; then log "kube-apiserver not ready after 60s; see $RUN/kube-apiserver.log"; exit 1; fi
  sleep 0.2
done

cat > "$RUN/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: ws-e2e
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 < "$RUN/pki/ca.crt")
users:
- name: admin
  user:
    token: $(cat "$RUN/token")
contexts:
- name: ws-e2e
  context: {cluster: ws-e2e, user: admin, namespace: default}
current-context: ws-e2e
KC
log "ready"
echo "$RUN/kubeconfig"
