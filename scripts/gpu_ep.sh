#!/usr/bin/env bash
# gpu_ep.sh - wna16.ep (expert parallelism over torch.distributed, issue 27)
# on a CUDA machine, run from the repository root, in one command of at
# most 10 minutes:
#
#   bash scripts/gpu_python.sh --prepare   # here, once: fills .gpu/pylib
#   bash scripts/gpu_ep.sh [OUT_DIR]       # there, with .gpu carried
#
# .gpu/ is what scripts/gpu_python.sh describes (libcjson debs, golden
# files, pytest for the image's python3).
#
#   1. builds libwna16.so into build-gpu/ (Release; the CPU target skips
#      without LLVM, saying why);
#   2. tests/python/test_ep.py with the image's python3 (torch with CUDA
#      and NCCL): test_ep_nccl runs one process per GPU with the NCCL
#      backend (world size 1 on one GPU: the same code as N ranks), a
#      256-expert top-8 layer in Marlin's layout, both dispatch formats,
#      M 1 to 256, uneven and rank-0-only routing, bf16, router weights on
#      the input, checked against the single-GPU layer (WNA16Experts over
#      every expert); the gloo tests run too where the CPU target exists;
#   3. bench/bench_ep.py --backend nccl: DeepSeek-V3's layer (256 experts,
#      top-8, H 7168, I 2048, int4 g128, bf16) at every world size the
#      GPUs allow, dispatch / compute / combine beside the single-GPU
#      layer, M = 1, 16, 64, 256, 1024, 4096 tokens a rank.
# Logs go to OUT_DIR (default $OUT, else gpu-out/ep), five files:
# machine.txt, build.log, python_ep.log, bench_ep.txt and summary.txt
# (every step's exit status; 77 = skipped). Exits 1 when a step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

out=${1:-${OUT:-gpu-out/ep}}
. scripts/gpu_env.sh

py=
for cand in ${WNA16_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$cand" > /dev/null 2>&1 &&
     "$cand" -c 'import numpy, torch' > /dev/null 2>&1; then
    py=$cand; break
  fi
done

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,compute_cap \
    --format=csv; git log -1 --format='%H %s' 2>/dev/null
  ${py:-python3} -c 'import sys, torch, torch.distributed as d
nccl = d.is_nccl_available()
if nccl:
    try:
        nccl = torch.cuda.nccl.version()
    except Exception:
        pass
print(sys.version.split()[0], "torch", torch.__version__, "cuda:",
      torch.cuda.is_available(), "GPUs:", torch.cuda.device_count(),
      "nccl:", nccl)'
} > "$out/machine.txt" 2>&1

step build "$out/build.log" sh -c "cmake -S . -B '$build' \
  -DCMAKE_BUILD_TYPE=Release -DWNA16_BUILD_TESTS=OFF \
  -DWNA16_GOLDEN_DIR='$golden' ${WNA16_CMAKE_ARGS:-} \
  && cmake --build '$build' -j\$(nproc) --target wna16_shared"
bdir=$build
lib=$bdir/libwna16.so.0
export WNA16_CACHE_DIR=$bdir/kernel-cache
mkdir -p "$WNA16_CACHE_DIR" && chmod 700 "$WNA16_CACHE_DIR"

if [ -n "$py" ]; then
  export WNA16_PYTHON=$py
  step python_ep "$out/python_ep.log" timeout 270 sh tests/python/run_pytest.sh \
    "$lib" "$PWD/include" "$golden" "$bdir/python-cache" numpy,torch \
    -vv -rs test_ep.py
  step bench_ep "$out/bench_ep.txt" timeout 240 env WNA16_LIBRARY="$lib" \
    "$py" bench/bench_ep.py --backend nccl
else
  echo "python: no python3 with numpy and torch: the Python steps were" \
       "not run" | tee -a "$summary"
  failed=1
fi
echo "results in $out (summary.txt)"
exit $failed
