#!/usr/bin/env bash
# Make a Prometheus server binary available at $ROOFTOP_CACHE/prometheus/bin/prometheus
# and print its path.
#
# Why Debian's package: no internet beyond package registries, so the upstream release
# tarball is out of reach; Debian's `prometheus` package is a registry package.
# Order: cached binary -> `prometheus` on PATH (symlinked) -> `apt-get download` + `dpkg -x`
# (no install, no root needed for the extraction; `apt-get update` only if the download fails).
# Idempotent: a cached binary that answers --version is reused.
set -euo pipefail

CACHE=${ROOFTOP_CACHE:-$HOME/.cache/rooftop}
DEST=$CACHE/prometheus
BIN=$DEST/bin/prometheus

log() { echo "fetch-prometheus: $*" >&2; }
works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

if works "$BIN"; then echo "$BIN"; exit 0; fi
mkdir -p "$DEST/bin"

if existing=$(command -v prometheus 2>/dev/null) && works "$existing"; then
  ln -sf "$existing" "$BIN"
  log "using $existing"
  echo "$BIN"; exit 0
fi

command -v apt-get >/dev/null || { log "no prometheus on PATH and no apt-get: install Prometheus and put it on PATH"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
if ! apt-get download prometheus >&2 2>"$tmp/err"; then
  log "apt-get download failed ($(tail -1 "$tmp/err")); running apt-get update"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq >&2; else sudo -n apt-get update -qq >&2; fi
  apt-get download prometheus >&2
fi
dpkg -x prometheus_*.deb root
install -m 0755 root/usr/bin/prometheus "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
works "$BIN" || { log "$BIN does not run: $("$BIN" --version 2>&1 | tail -1)"; exit 1; }
log "$("$BIN" --version 2>&1 | head -1)"
echo "$BIN"
