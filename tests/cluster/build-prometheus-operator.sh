#!/usr/bin/env bash
# Build the Prometheus Operator from its Go module (Apache-2.0) through the Go module
# proxy, into a cache outside the repository, and keep its CRDs from the same module.
#
# Why from source: no Docker engine and no internet beyond package registries, so its
# release images and tarballs are out of reach; the Go module proxy is not. The e2e
# tests run it against the local control plane, so PodMonitors and PrometheusRules are
# turned into Prometheus configuration by its own rules, as users run it.
#
# Usage: tests/cluster/build-prometheus-operator.sh   -> prints the install directory,
#        which holds bin/operator and crds/*.yaml
# Env:   ROOFTOP_CACHE (default ~/.cache/rooftop)
set -euo pipefail

VERSION=v0.85.0
MODULE=github.com/prometheus-operator/prometheus-operator

CACHE=${ROOFTOP_CACHE:-$HOME/.cache/rooftop}
DEST=$CACHE/prometheus-operator-$VERSION
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
export GOMAXPROCS=${GOMAXPROCS:-2}
export PATH=$PATH:/usr/local/go/bin

log() { echo "build-prometheus-operator: $*" >&2; }

if [ -x "$DEST/bin/operator" ] && [ -f "$DEST/crds/.complete" ]; then
  log "cached: $DEST"
  echo "$DEST"
  exit 0
fi
command -v go >/dev/null || { log "no Go toolchain on PATH (or in /usr/local/go/bin)"; exit 1; }
mkdir -p "$DEST/bin" "$DEST/crds"
# `go install MODULE/cmd/operator@VERSION` refuses a module whose go.mod replaces its
# nested modules (pkg/apis/monitoring, pkg/client) with local directories, which the
# module's zip does not hold; the proxy serves them at the same version, which go.mod
# requires anyway. So: its source, those replaces dropped, built in place.
log "downloading $MODULE@$VERSION"
mod=$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
src=$DEST/src
rm -rf "$src"
cp -r "$mod" "$src"
chmod -R u+w "$src"
cd "$src"
go mod edit -dropreplace="$MODULE/pkg/apis/monitoring" -dropreplace="$MODULE/pkg/client"
log "building $MODULE/cmd/operator@$VERSION"
GOFLAGS="$GOFLAGS -mod=mod" go build -o "$DEST/bin/operator.tmp" \
  -ldflags "-X github.com/prometheus/common/version.Version=${VERSION#v}" ./cmd/operator
mv "$DEST/bin/operator.tmp" "$DEST/bin/operator"
# The CRDs the same release ships (example/prometheus-operator-crd).
cp "$src"/example/prometheus-operator-crd/*.yaml "$DEST/crds/"
chmod -R u+w "$DEST/crds"
touch "$DEST/crds/.complete"
log "$("$DEST/bin/operator" --version 2>&1 | head -1)"
echo "$DEST"
