#!/usr/bin/env bash
# gpu_python.sh [OUT_DIR] - the host-integration checks that need a CUDA GPU
# (issue 24), for the GPU machine, run from the repository root:
#   1. builds libwna16.so and the wna16 command into build-gpu/ (LLVM is
#      used when found; WNA16_CMAKE_ARGS adds options);
#   2. examples/moe_host.c against build-gpu/libwna16.so: the golden GPTQ
#      layer selected (marlin on sm_90), repacked on the GPU and run by the
#      tensor-core kernels for M = 1, 16, 64, 256;
#   3. the Python tests: test_cuda.py (CudaMoe with host arrays, with
#      device arrays from the CUDA driver on a stream of their own, the
#      batched format, bad ids reported by sync(); WNA16Experts on torch
#      CUDA tensors when torch has CUDA), then test_api.py and
#      test_torch.py (what runs on the CPU, again on this machine);
#   4. examples/moe_host.py on the GPU.
# Each step's output goes to OUT_DIR (default ${OUT:-gpu-out}/python) and
# summary.txt lists every step's exit status; the script exits non-zero
# when a step failed (a skipped step, 77, is not a failure). Needs cmake,
# a C compiler and the CUDA toolkit's headers; Python steps need python3
# with numpy and pytest (torch optional) and are skipped without them.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-out}/python}
mkdir -p "$out"
golden=${WNA16_GOLDEN_DIR:-$(cd .. && pwd)/shared/golden}
build=${WNA16_GPU_BUILD:-build-gpu}
summary=$out/summary.txt
: > "$summary"
failed=0
step() { # step NAME COMMAND...: runs it, logs to OUT/NAME.log, records rc
  local name=$1; shift
  echo "== $name: $*"
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  echo "$name: exit $rc" | tee -a "$summary"
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then failed=1; fi
  return 0
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,compute_cap \
    --format=csv; git log -1 --format='%H %s'; } > "$out/machine.txt" 2>&1

step build sh -c "cmake -S . -B '$build' -DCMAKE_BUILD_TYPE=Release \
  -DWNA16_BUILD_TESTS=OFF -DWNA16_GOLDEN_DIR='$golden' ${WNA16_CMAKE_ARGS:-} \
  && cmake --build '$build' -j\$(nproc) --target wna16_shared wna16_cli"
lib=$PWD/$build/libwna16.so.0
export WNA16_CACHE_DIR=$PWD/$build/kernel-cache
mkdir -p "$WNA16_CACHE_DIR" && chmod 700 "$WNA16_CACHE_DIR"

step example_c sh -c "cc -std=c17 -O2 -Wall -Wextra -Werror \
  examples/moe_host.c -Iinclude '$lib' -Wl,-rpath,'$PWD/$build' \
  -o '$build/moe_host' && '$build/moe_host' '$golden/gptq_b4_g128' \
  --batches 1,16,64,256 --repeat 5"

py=
for cand in ${WNA16_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$cand" > /dev/null 2>&1 &&
     "$cand" -c 'import numpy, pytest' > /dev/null 2>&1; then
    py=$cand; break
  fi
done
if [ -n "$py" ]; then
  export WNA16_PYTHON=$py
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda:",
torch.cuda.is_available())' > "$out/torch.txt" 2>&1
  for t in "cuda numpy,cuda test_cuda.py" "api numpy test_abi.py test_api.py" \
           "torch numpy,torch test_torch.py"; do
    set -- $t
    name=$1 mods=$2; shift 2
    step "python_$name" sh tests/python/run_pytest.sh "$lib" "$PWD/include" \
      "$golden" "$PWD/$build/python-cache" "$mods" -v -rs "$@"
  done
  step example_py env WNA16_LIBRARY="$lib" PYTHONPATH="$PWD/python" "$py" \
    examples/moe_host.py "$golden/gptq_b4_g128" --batches 1,16,64,256 \
    --repeat 5
else
  echo "python: no python3 with numpy and pytest: Python steps skipped" |
    tee -a "$summary"
fi
echo "results in $out (summary.txt)"
exit $failed
