#!/bin/bash
# Starts a real etcd (Debian etcd-server) and the kube-apiserver v1.20.2 built by
# build-kube-apiserver.sh, on loopback only, in directory $1 (default: a new temp dir).
# Prints the directory on success. It holds:
#   tokens.csv   static tokens: "test-token" is system:masters (admin)
#   kubeconfig   admin kubeconfig for kubectl / weftd --kubeconfig-file (CA-verified TLS)
#   certs/       the apiserver's self-signed serving cert (apiserver.crt also holds its CA)
#   *.log, *.pid
# Ports: PORT (apiserver, default 16443), EPORT (etcd client, default 23790; peer = EPORT+10).
# Stop with: kill $(cat DIR/apiserver.pid) $(cat DIR/etcd.pid)
# Same as ../../../shared/recipes/run-kube-apiserver.sh, plus the kubeconfig and
# --allow-privileged (as real clusters run it, so privileged DaemonSets validate).
set -euo pipefail
W=${WEFT_TOOLS:-$HOME/.cache/weft-tools}
APISERVER=$W/bin/kube-apiserver
[[ -x $APISERVER ]] || { echo "missing $APISERVER: run scripts/tools/build-kube-apiserver.sh" >&2; exit 1; }
D=${1:-$(mktemp -d)}; PORT=${PORT:-16443}; EPORT=${EPORT:-23790}
mkdir -p "$D/certs"
echo "test-token,admin,admin,system:masters" > "$D/tokens.csv"
[[ -f $D/sa.key ]] || { openssl genrsa -out "$D/sa.key" 2048 2>/dev/null; openssl rsa -in "$D/sa.key" -pubout -out "$D/sa.pub" 2>/dev/null; }
etcd --name weft-kapi --data-dir "$D/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$EPORT" --advertise-client-urls "http://127.0.0.1:$EPORT" \
  --listen-peer-urls "http://127.0.0.1:$((EPORT+10))" --initial-advertise-peer-urls "http://127.0.0.1:$((EPORT+10))" \
  --initial-cluster "weft-kapi=http://127.0.0.1:$((EPORT+10))" > "$D/etcd.log" 2>&1 &
echo $! > "$D/etcd.pid"
for _ in $(seq 1 30); do curl -sf "http://127.0.0.1:$EPORT/health" >/dev/null && break; sleep 0.5; done
"$APISERVER" \
  --etcd-servers="http://127.0.0.1:$EPORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$PORT" \
  --cert-dir="$D/certs" --token-auth-file="$D/tokens.csv" --authorization-mode=RBAC \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$D/sa.pub" --service-account-signing-key-file="$D/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true \
  --enable-priority-and-fairness=false --endpoint-reconciler-type=none \
  > "$D/apiserver.log" 2>&1 &
echo $! > "$D/apiserver.pid"
for _ in $(seq 1 90); do curl -skf -H "Authorization: Bearer test-token" "https://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 1; done
curl -skf -H "Authorization: Bearer test-token" "https://127.0.0.1:$PORT/readyz" >/dev/null
cat > "$D/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: weft-test
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority: $D/certs/apiserver.crt
users:
- name: admin
  user:
    token: test-token
contexts:
- name: weft-test
  context: {cluster: weft-test, user: admin}
current-context: weft-test
KC
echo "$D"
