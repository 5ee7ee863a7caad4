#!/usr/bin/env bash
# Builds wna16 on a GPU machine and runs everything that needs the GPU: the
# GPU tests (labels cuda, gpu: the CUDA runtime, GPU repack, the fused MoE
# against the reference), the repack tests (golden files included), then
# bench_repack_cuda, bench_moe_cuda and its torch baseline
# (bench_moe_torch.py, needs python3 with torch). Logs go to $OUT (default
# ./gpu-out).
#
#   [STEP=tests|bench|all] bash bench/gpu_session.sh [GOLDEN_DIR]
#
# For a machine without network: copy the libcjson1 and libcjson-dev .deb
# files into .gpu/debs and the golden files into .gpu/golden beside the
# checkout's root; the script unpacks the packages first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
GOLDEN=${1:-$PWD/.gpu/golden}
[ -d "$GOLDEN" ] || GOLDEN=$PWD/../shared/golden
if ls .gpu/debs/*.deb >/dev/null 2>&1; then
  for f in .gpu/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia-smi -L > "$OUT/device.txt" 2>&1
gen=; command -v ninja >/dev/null && gen="-G Ninja"
cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWNA16_GOLDEN_DIR="$GOLDEN" > "$OUT/build.log" 2>&1 &&
cmake --build build-gpu -j"$(nproc)" >> "$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
cd build-gpu
export WNA16_CACHE_DIR=$PWD/kcache
STEP=${STEP:-all}
if [ "$STEP" = all ] || [ "$STEP" = tests ]; then
  # GPU tests one or two at a time: each process starts its own context
  ctest -L gpu --output-on-failure -j2 > "$OUT/ctest-gpu.log" 2>&1
  ctest -R 'golden|checkpoint|target_cuda' --output-on-failure -j4 \
    > "$OUT/ctest-repack.log" 2>&1
  ./tests/repack/test_repack_golden > "$OUT/repack_golden.txt" 2>&1
  tail -25 "$OUT/ctest-gpu.log"; tail -8 "$OUT/ctest-repack.log"
  # `wna16 run --target cuda` with an empty kernel cache, twice: the first
  # process may also read NVRTC's libraries from disk, the second finds
  # them in the page cache; both compile every kernel
  for i in 1 2; do
    rm -rf "$PWD/kcache-run"
    WNA16_CACHE_DIR=$PWD/kcache-run ./wna16 run --target cuda \
      > "$OUT/run_cold$i.txt" 2>&1
    grep -E "first call|result" "$OUT/run_cold$i.txt"
  done
fi
if [ "$STEP" = all ] || [ "$STEP" = bench ]; then
  ./bench/bench_repack_cuda 2>&1 | tee "$OUT/bench_repack_cuda.txt"
  mkdir -p routing
  ./bench/bench_moe_cuda --routing-out routing 2>&1 |
    tee "$OUT/bench_moe_cuda.txt"
  # the bf16 torch._grouped_mm layer on the same shapes and the same
  # routing, with the ratio
  python3 ../bench/bench_moe_torch.py --cuda-bench "$OUT/bench_moe_cuda.txt" \
    --routing routing 2>&1 | tee "$OUT/bench_moe_torch.txt"
fi
