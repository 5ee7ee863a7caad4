#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs the main job:
# installs missing packages, configures and builds (build/), then runs
# `wna16 run` on its embedded default. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
wna16_install_deps
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
./build/wna16 run
