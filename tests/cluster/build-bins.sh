#!/usr/bin/env bash
# Build the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl), kwok and helm from pinned Go modules through the Go
# module proxy, into a cache outside the repository.
#
# Why from source: no Docker engine and no internet beyond package registries,
# so release tarballs and kind images are out of reach; the Go module proxy is not.
# Recipe: go build of k8s.io/kubernetes at a release tag, its staging modules pinned by
# a replace block (kubernetes/kubernetes#79384 explains why it is needed).
#
# Usage: tests/cluster/build-bins.sh            -> prints the bin directory
# Env:   ROOFTOP_CACHE (default ~/.cache/rooftop), KUBEBUILDER_ASSETS (if it already
#        holds etcd + kube-apiserver, nothing is built for those).
set -euo pipefail

K8S_VERSION=1.34.3
STAGING_VERSION=0.34.3
K8S_MINOR=34
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.21.4

CACHE=${ROOFTOP_CACHE:-$HOME/.cache/rooftop}
BIN=$CACHE/k8s-v$K8S_VERSION/bin
WORK=$CACHE/k8s-v$K8S_VERSION/src
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
# Two cores: keep the linker from running several 2 GB links at once.
export GOMAXPROCS=${GOMAXPROCS:-2}
mkdir -p "$BIN" "$WORK"

log() { echo "build-bins: $*" >&2; }

need() { for b in "$@"; do [ -x "$BIN/$b" ] || return 0; done; return 1; }

# build_kubernetes [CMD...]: the control plane's commands by default; build-node.sh asks
# for kubelet and kube-proxy from the same module, work dir and ldflags.
build_kubernetes() {
  local cmds=("$@")
  [ ${#cmds[@]} -gt 0 ] || cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  need "${cmds[@]}" || { log "kubernetes binaries cached: ${cmds[*]}"; return; }
  cd "$WORK"
  exec 9>"$WORK/.lock"; flock 9  # one build at a time edits go.mod here
  [ -f go.mod ] || go mod init example.invalid/k8sbins >&2
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
    | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
    go mod edit -replace="$m=$m@v$STAGING_VERSION"
  done
  log "resolving k8s.io/kubernetes@v$K8S_VERSION"
  local pkgs=() cmd
  for cmd in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd@v$K8S_VERSION"); done
  go get "${pkgs[@]}" >&2
  local v=k8s.io/component-base/version c=k8s.io/client-go/pkg/version
  local ldf="-s -w -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$K8S_MINOR"
  ldf+=" -X $v.gitTreeState=clean -X $v.buildDate=2025-01-01T00:00:00Z"
  ldf+=" -X $c.gitVersion=v$K8S_VERSION -X $c.gitMajor=1 -X $c.gitMinor=$K8S_MINOR"
  for cmd in "${cmds[@]}"; do
    [ -x "$BIN/$cmd" ] && continue
    log "building $cmd (several minutes on 2 cores)"
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldf" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd" >&2
    mv "$BIN/$cmd.tmp" "$BIN/$cmd"
  done
  exec 9>&-
}

build_etcd() {
  need etcd || { log "etcd cached"; return; }
  cd "$WORK"
  local etcd_version
  etcd_version=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3 2>/dev/null || echo v3.6.4)
  log "building etcd $etcd_version"
  go get "go.etcd.io/etcd/server/v3@$etcd_version" >&2
  CGO_ENABLED=0 go build -trimpath -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_tools() {
  if need kwok; then
    log "building kwok $KWOK_VERSION"
    CGO_ENABLED=0 GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  fi
  if need helm; then
    log "building helm $HELM_VERSION"
    local hl="-s -w -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$K8S_MINOR"
    hl+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR"
    hl+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    CGO_ENABLED=0 GOBIN="$BIN" go install -ldflags "$hl" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  fi
}

main() {
  # Users with their own envtest binaries (setup-envtest) keep them.
  if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ] \
     && [ -x "$KUBEBUILDER_ASSETS/etcd" ]; then
    for b in "$KUBEBUILDER_ASSETS"/*; do [ -e "$BIN/$(basename "$b")" ] || ln -s "$b" "$BIN/"; done
  fi
  command -v go >/dev/null || { log "Go is required (https://go.dev/dl); none found"; exit 1; }
  build_tools
  build_kubernetes
  build_etcd
  echo "$BIN"
}

# Sourced (build-node.sh), only the functions and settings are wanted.
[ "${BASH_SOURCE[0]}" != "$0" ] || main "$@"
