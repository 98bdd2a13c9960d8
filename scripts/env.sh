# scripts/env.sh: sourced by scripts/test and scripts/run. Installs the Debian packages the build
# needs (when missing), makes sure NVRTC can be found (the CUDA Toolkit's, or NVIDIA's wheel from
# PyPI as a fallback), and configures + builds into $FLASHGEN_BUILD_DIR (default: build).
set -euo pipefail
FG_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FG_BUILD=${FLASHGEN_BUILD_DIR:-$FG_ROOT/build}
FG_PACKAGES="cmake ninja-build gcc pkg-config liblua5.4-dev libsqlite3-dev libcriterion-dev python3"

fg_log() { printf '[flashgen] %s\n' "$*" >&2; }

fg_install_packages() {
  local missing=()
  for p in $FG_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  fg_log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# NVRTC is loaded at run time with dlopen; the build does not need it, the compile tests do.
fg_find_nvrtc() {
  [ -n "${FLASHGEN_NVRTC_LIBRARY:-}" ] && return 0
  if ldconfig -p 2>/dev/null | grep -qE 'libnvrtc\.so\.(13|12) '; then return 0; fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    for v in 13 12; do
      if [ -e "$d/libnvrtc.so.$v" ]; then export FLASHGEN_NVRTC_LIBRARY="$d/libnvrtc.so.$v"; return 0; fi
    done
  done
  local wheel="$FG_ROOT/.deps/nvrtc"
  if ! ls "$wheel"/nvidia/cu13/lib/libnvrtc.so.13 >/dev/null 2>&1; then
    fg_log "no NVRTC found; installing NVIDIA's nvidia-cuda-nvrtc wheel into $wheel"
    python3 -m pip install -q --target "$wheel" "nvidia-cuda-nvrtc>=13,<14" >/dev/null || {
      fg_log "could not install NVRTC: install the CUDA Toolkit or set FLASHGEN_NVRTC_LIBRARY"; return 1; }
  fi
  FLASHGEN_NVRTC_LIBRARY=$(ls "$wheel"/nvidia/cu13/lib/libnvrtc.so.13 "$wheel"/nvidia/*/lib/libnvrtc.so.1[23] 2>/dev/null | head -n1)
  export FLASHGEN_NVRTC_LIBRARY
}

fg_build() {
  local type=${1:-RelWithDebInfo} dir=${2:-$FG_BUILD}
  cmake -S "$FG_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" >/dev/null
  cmake --build "$dir" -j "$(nproc)"
}
