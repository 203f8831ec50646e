#!/usr/bin/env bash
# Build and install what one REAL node needs (tests/cluster/realnode.py): kubelet and
# kube-proxy, CNI plugins, containerd + runc, kubernetes' pause binary; print the bin
# directory that holds (links to) all of them, $ROOFTOP_CACHE/node/bin. CNI plugins go
# to $ROOFTOP_CACHE/node/cni-bin (containerd's CNI bin_dir holds nothing else).
#
# Where each comes from (no release tarballs or images are reachable, package registries
# are):
#   kubelet, kube-proxy   the same pinned k8s.io/kubernetes module, work dir and ldflags
#                         as the control plane (build-bins.sh's build_kubernetes)
#   bridge, host-local,   github.com/containernetworking/plugins (go install; its go.mod
#   loopback, portmap     has no replace directives)
#   containerd, runc      Debian packages (bookworm: containerd 1.6, runc 1.1), with
#                         iptables, nftables and conntrack for kube-proxy
#   pause                 k8s.io/kubernetes' build/pause/linux/pause.c, gcc -static
#
# Idempotent and cached: only what is missing is built or installed.
# Usage: tests/cluster/build-node.sh          -> prints the bin directory
#        tests/cluster/build-node.sh pause    -> builds only the pause binary, prints it
# Env:   ROOFTOP_CACHE (default ~/.cache/rooftop), GOMAXPROCS (default 2)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=build-bins.sh
source "$HERE/build-bins.sh"  # K8S_VERSION, CACHE, BIN, WORK, log, build_kubernetes

CNI_VERSION=v1.9.1
CNI_PLUGINS=(main/bridge ipam/host-local main/loopback meta/portmap)
PAUSE_VERSION=3.10.1  # build/pause/Makefile's TAG in k8s.io/kubernetes v1.34.3
NODE=$CACHE/node
NODE_BIN=$NODE/bin
CNI_BIN=$NODE/cni-bin
# Debian package -> the binaries the node uses from it.
declare -A DEB_BINARIES=(
  [containerd]="containerd containerd-shim-runc-v2 ctr"
  [runc]="runc"
  [iptables]="iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore"
  [nftables]="nft"
  [conntrack]="conntrack"
)

nlog() { echo "build-node: $*" >&2; }

install_debs() {
  local pkg b missing=()
  for pkg in "${!DEB_BINARIES[@]}"; do
    for b in ${DEB_BINARIES[$pkg]}; do
      command -v "$b" >/dev/null || { missing+=("$pkg"); break; }
    done
  done
  if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || { nlog "install ${missing[*]} (no apt-get here)"; exit 1; }
    nlog "apt-get install ${missing[*]}"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  fi
  for pkg in "${!DEB_BINARIES[@]}"; do
    for b in ${DEB_BINARIES[$pkg]}; do
      ln -sfn "$(command -v "$b")" "$NODE_BIN/$b"
    done
  done
}

build_node_kubernetes() {
  build_kubernetes kubelet kube-proxy
  ln -sfn "$BIN/kubelet" "$NODE_BIN/kubelet"
  ln -sfn "$BIN/kube-proxy" "$NODE_BIN/kube-proxy"
}

build_cni() {
  local p missing=()
  for p in "${CNI_PLUGINS[@]}"; do [ -x "$CNI_BIN/${p##*/}" ] || missing+=("$p"); done
  if [ ${#missing[@]} = 0 ]; then nlog "CNI plugins $CNI_VERSION cached"; return; fi
  nlog "building CNI plugins $CNI_VERSION: ${missing[*]##*/}"
  local pkgs=()
  for p in "${missing[@]}"; do pkgs+=("github.com/containernetworking/plugins/plugins/$p@$CNI_VERSION"); done
  CGO_ENABLED=0 GOBIN="$CNI_BIN" go install -trimpath -ldflags "-s -w" "${pkgs[@]}" >&2
}

# Prints the pause binary's path.
build_pause() {
  local out=$NODE_BIN/pause
  if [ ! -x "$out" ]; then
    command -v gcc >/dev/null || { nlog "gcc is required for the pause binary"; exit 1; }
    local dir
    dir=$(cd / && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
      | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
    nlog "building pause $PAUSE_VERSION from $dir/build/pause/linux/pause.c"
    gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-rooftop" \
      -o "$out.tmp" "$dir/build/pause/linux/pause.c" >&2
    strip "$out.tmp"
    mv "$out.tmp" "$out"
  fi
  echo "$out"
}

node_main() {
  mkdir -p "$NODE_BIN" "$CNI_BIN"
  if [ "${1:-}" = pause ]; then build_pause; return; fi
  command -v go >/dev/null || { nlog "Go is required (https://go.dev/dl); none found"; exit 1; }
  install_debs
  build_pause >/dev/null
  build_cni
  build_node_kubernetes
  echo "$NODE_BIN"
}

node_main "$@"
