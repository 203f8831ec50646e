#!/usr/bin/env bash
# Make a Prometheus server binary available at $ROOFTOP_CACHE/prometheus/bin/prometheus,
# and promtool (the chart's alert rule tests run `promtool check/test rules`) next to it
# at $ROOFTOP_CACHE/prometheus/bin/promtool; print the server's path.
#
# Why Debian's package: no internet beyond package registries, so the upstream release
# tarball is out of reach; Debian's `prometheus` package is a registry package, and it
# ships promtool too.
# Order, per binary: cached -> on PATH (symlinked) -> `apt-get download` + `dpkg -x`
# (no install, no root needed for the extraction; `apt-get update` only if the download
# fails; one download serves both binaries).
# Idempotent: cached binaries that answer --version are reused.
set -euo pipefail

CACHE=${ROOFTOP_CACHE:-$HOME/.cache/rooftop}
DEST=$CACHE/prometheus
BIN=$DEST/bin/prometheus
NAMES=(prometheus promtool)

log() { echo "fetch-prometheus: $*" >&2; }
works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

mkdir -p "$DEST/bin"
missing=()
for name in "${NAMES[@]}"; do
  works "$DEST/bin/$name" && continue
  if existing=$(command -v "$name" 2>/dev/null) && works "$existing"; then
    ln -sf "$existing" "$DEST/bin/$name"
    log "using $existing"
    continue
  fi
  missing+=("$name")
done
if [ ${#missing[@]} = 0 ]; then echo "$BIN"; exit 0; fi

command -v apt-get >/dev/null || { log "no ${missing[*]} on PATH and no apt-get: install Prometheus (with promtool) and put it on PATH"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
if ! apt-get download prometheus >&2 2>"$tmp/err"; then
  log "apt-get download failed ($(tail -1 "$tmp/err")); running apt-get update"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq >&2; else sudo -n apt-get update -qq >&2; fi
  apt-get download prometheus >&2
fi
dpkg -x prometheus_*.deb root
for name in "${missing[@]}"; do
  out=$DEST/bin/$name
  install -m 0755 "root/usr/bin/$name" "$out.tmp"
  mv "$out.tmp" "$out"
  works "$out" || { log "$out does not run: $("$out" --version 2>&1 | tail -1)"; exit 1; }
  log "$("$out" --version 2>&1 | head -1)"
done
echo "$BIN"
