#!/usr/bin/env bash
# Installs the Debian 12 packages wna16 builds and tests with, if any is
# missing. Sourced by setup.sh and test.sh; safe to run again (a no-op when
# everything is there). Needs root or sudo only when something is missing.
set -euo pipefail

WNA16_PACKAGES=(
  cmake make gcc libc6-dev pkg-config   # the build
  libcjson-dev                          # spec and safetensors JSON (required)
  llvm-19-dev clang-19 libclang-rt-19-dev  # CPU JIT target, sanitizers
  libxxhash-dev                         # kernel cache keys
  spirv-tools spirv-headers             # SPIR-V validation, the emitter's numbers
  libze-dev                             # Level Zero target
  ocl-icd-opencl-dev pocl-opencl-icd llvm-spirv-15  # ocl target: SPIR-V on the CPU
  valgrind                              # memory checks
  python3-numpy python3-pytest          # the Python binding's tests
  python3-torch                         # wna16.torch (WNA16Experts) tests
)

wna16_install_deps() {
  local missing=()
  for p in "${WNA16_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "wna16: installing missing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then
      sudo="sudo"
    else
      echo "wna16: need root (or sudo) to install: ${missing[*]}" >&2
      return 1
    fi
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  wna16_install_deps
fi
