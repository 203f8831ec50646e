#!/usr/bin/env bash
# Make a Prometheus server binary available at $ROOFTOP_CACHE/prometheus/bin/prometheus,
# and promtool (the chart's alert rule tests run `promtool check/test rules`) next to it
# at $ROOFTOP_CACHE/prometheus/bin/promtool; print the server's path.
#
# Why Debian's packages: no internet beyond package registries, so the upstream release
# tarball is out of reach; Debian's `prometheus` and `promtool` are registry packages.
# Why Debian 13 (trixie)'s, on any Debian: the Prometheus Operator tests run the server
# on the configuration the operator generates, and Prometheus Operator v0.85 generates
# it for Prometheus 2.45 and later (its compatibility matrix); bookworm ships 2.42.
# The .deb is located through trixie's package index and checked against the SHA256
# the index gives, then unpacked with `dpkg -x` (no install, no root).
# Order, per binary: cached -> on PATH (symlinked) -> downloaded; each only if it is
# MIN_VERSION or later. Idempotent: cached binaries of that version are reused.
set -euo pipefail

CACHE=${ROOFTOP_CACHE:-$HOME/.cache/rooftop}
DEST=$CACHE/prometheus
BIN=$DEST/bin/prometheus
NAMES=(prometheus promtool)
MIN_VERSION=2.45.0
MIRROR=${ROOFTOP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie

log() { echo "fetch-prometheus: $*" >&2; }
version_of() { "$1" --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1; }
works() {
  [ -x "$1" ] || return 1
  local v
  v=$(version_of "$1") || return 1
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$MIN_VERSION" "$v" | sort -V | head -1)" = "$MIN_VERSION" ]
}

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

command -v dpkg >/dev/null || { log "no Prometheus $MIN_VERSION+ (${missing[*]}) on PATH and no dpkg: install Prometheus with promtool and put them on PATH"; exit 1; }
arch=$(dpkg --print-architecture)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
curl -fsS --retry 3 "$MIRROR/dists/$SUITE/main/binary-$arch/Packages.xz" | xz -d > Packages
for name in "${missing[@]}"; do
  # the stanza of package $name: its pool path and checksum
  read -r file sum < <(awk -v pkg="$name" '
    /^Package: / { p = ($2 == pkg) } p && /^Filename: / { f = $2 } p && /^SHA256: / { s = $2 }
    /^$/ { if (p && f) { print f, s; exit } p = 0 }' Packages)
  [ -n "${file:-}" ] || { log "$name is not in $SUITE's index for $arch"; exit 1; }
  curl -fsS --retry 3 -o "$name.deb" "$MIRROR/$file"
  echo "$sum  $name.deb" | sha256sum -c --quiet - || { log "$file: SHA256 differs from the index"; exit 1; }
  dpkg -x "$name.deb" root
  out=$DEST/bin/$name
  install -m 0755 "root/usr/bin/$name" "$out.tmp"
  mv "$out.tmp" "$out"
  works "$out" || { log "$out does not run as $MIN_VERSION+: $("$out" --version 2>&1 | tail -1)"; exit 1; }
  log "$("$out" --version 2>&1 | head -1)"
done
echo "$BIN"
