#!/usr/bin/env bash
# The whole test suite: installs missing packages, configures with warnings
# as errors, builds everything (including the ASan+UBSan library for the
# fuzz tests) and runs every CTest test. Usage: bash scripts/test.sh
# Extra arguments go to ctest (e.g. -L spec, -R golden).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
wna16_install_deps
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWNA16_WERROR=ON
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
