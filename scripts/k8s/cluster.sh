#!/usr/bin/env bash
# A real, node-less Kubernetes control plane on loopback for the operator tests and for local trials:
#   etcd (Debian) + kube-apiserver + kube-controller-manager (built by scripts/setup/20-k8s.sh).
# There is no scheduler and no kubelet: Pods stay Pending. The job controller is off, so a test plays
# its part by patching Job status; garbage collection, Deployment and ReplicaSet controllers are real.
#
#   scripts/k8s/cluster.sh up STATE_DIR     start, wait for /readyz, write STATE_DIR/kubeconfig
#   scripts/k8s/cluster.sh down STATE_DIR   stop what `up` started (by the pids it recorded)
# Ports: $ETCD_PORT (default 12379; peer port +1) and $APISERVER_PORT (default 16443).
set -euo pipefail
cmd=${1:?usage: cluster.sh up|down STATE_DIR}
D=$(realpath -m "${2:?usage: cluster.sh up|down STATE_DIR}")
TOOLS=${NINFER_TOOLS:-$HOME/.cache/ninfer-tools}
export PATH="$TOOLS/bin:$PATH"
ETCD_PORT=${ETCD_PORT:-12379}
APISERVER_PORT=${APISERVER_PORT:-16443}

stop() {
  local p
  for p in controller-manager apiserver etcd; do  # reverse start order
    if [ -f "$D/$p.pid" ]; then
      kill "$(cat "$D/$p.pid")" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$(cat "$D/$p.pid")" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$(cat "$D/$p.pid")" 2>/dev/null || true
      rm -f "$D/$p.pid"
    fi
  done
}

need() { command -v "$1" >/dev/null || { echo "missing $1: run scripts/setup/20-k8s.sh" >&2; exit 2; }; }

up() {
  need etcd; need kube-apiserver; need kube-controller-manager; need kubectl; need openssl
  mkdir -p "$D"
  [ -f "$D/sa.key" ] || {
    openssl genrsa -out "$D/sa.key" 2048 2>/dev/null
    openssl rsa -in "$D/sa.key" -pubout -out "$D/sa.pub" 2>/dev/null
  }
  echo 'ninfer-test-token,admin,admin,system:masters' > "$D/tokens.csv"
  cat > "$D/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$APISERVER_PORT", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: ninfer-test-token}
contexts:
- name: local
  context: {cluster: local, user: admin, namespace: default}
current-context: local
EOF
  etcd --name ninfer-test --data-dir "$D/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "ninfer-test=http://127.0.0.1:$((ETCD_PORT + 1))" >"$D/etcd.log" 2>&1 &
  echo $! > "$D/etcd.pid"
  kube-apiserver --etcd-servers="http://127.0.0.1:$ETCD_PORT" --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" --insecure-port=0 --cert-dir="$D/certs" \
    --token-auth-file="$D/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$D/sa.pub" \
    --service-account-signing-key-file="$D/sa.key" --service-cluster-ip-range=10.96.0.0/16 \
    >"$D/apiserver.log" 2>&1 &
  echo $! > "$D/apiserver.pid"
  local ok=0
  for _ in $(seq 120); do
    if kubectl --kubeconfig "$D/kubeconfig" get --raw /readyz >/dev/null 2>&1; then ok=1; break; fi
    kill -0 "$(cat "$D/apiserver.pid")" 2>/dev/null || break
    sleep 0.5
  done
  if [ $ok -ne 1 ]; then
    echo "kube-apiserver did not become ready; last log lines:" >&2; tail -20 "$D/apiserver.log" >&2
    stop; exit 1
  fi
  kube-controller-manager --kubeconfig="$D/kubeconfig" --bind-address=127.0.0.1 --port=0 --secure-port=0 \
    --service-account-private-key-file="$D/sa.key" --root-ca-file="$D/certs/apiserver.crt" \
    --controllers='*,-job,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-ttl,-ttl-after-finished' \
    --leader-elect=false >"$D/controller-manager.log" 2>&1 &
  echo $! > "$D/controller-manager.pid"
  echo "cluster up: KUBECONFIG=$D/kubeconfig"
}

case "$cmd" in
  up) up ;;
  down) stop ;;
  *) echo "usage: cluster.sh up|down STATE_DIR" >&2; exit 2 ;;
esac
