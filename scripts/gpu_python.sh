#!/usr/bin/env bash
# gpu_python.sh - the host-integration checks (issue 24) that need a CUDA
# GPU, for the GPU machine, run from the repository root.
#
#   bash scripts/gpu_python.sh --prepare   # here, once: fills .gpu/pylib
#   bash scripts/gpu_python.sh [OUT_DIR]   # there, with .gpu carried
#
# .gpu/ (git-ignored through .git/info/exclude, as for bench/gpu_session.sh)
# holds what the GPU machine cannot fetch: debs/ (libcjson1, libcjson-dev:
# unpacked first), golden/ (../shared/golden) and pylib/ (pytest and what
# it imports, copied from this machine's Debian packages by --prepare; put
# last on PYTHONPATH, so the image's own packages win).
#
# On the GPU machine:
#   1. builds libwna16.so and the wna16 command into build-gpu/ (without
#      LLVM on that image: the CPU parts skip, saying why);
#   2. examples/moe_host.c against build-gpu/libwna16.so: the golden GPTQ
#      layer, selection's backend for the device (marlin on sm_90),
#      repacked on the GPU and run by the tensor-core kernels for M = 1,
#      16, 64, 256, first and cached times;
#   3. the Python tests with the image's python3 (torch with CUDA):
#      test_cuda.py (CudaMoe with host arrays; device arrays from the CUDA
#      driver on a stream of their own; batched; a bad id reported by
#      sync(); WNA16Experts on torch CUDA tensors on a non-default current
#      stream, expert map, on-input weights), then test_api.py/test_abi.py
#      and test_torch.py (what runs without the GPU);
#   4. examples/moe_host.py on the GPU.
# Logs go to OUT_DIR (default $OUT, else gpu-out/python), eight files at
# most: machine.txt, build.log, example_c.log, python_cuda.log,
# python_api.log, python_torch.log, example_py.log and summary.txt (every
# step's exit status; 77 = skipped). Exits 1 when a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --prepare ]; then
  # pytest 7.2 and its imports from Debian's python3-pytest (pure Python)
  src=/usr/lib/python3/dist-packages
  dst=.gpu/pylib
  mkdir -p "$dst"
  for m in pytest _pytest pluggy iniconfig attr attrs py py.py packaging \
           exceptiongroup tomli; do
    [ -e "$src/$m" ] && cp -r "$src/$m" "$dst/"
  done
  [ -d .gpu/golden/gptq_b4_g128 ] || {
    mkdir -p .gpu/golden
    cp -r ../shared/golden/gptq_b4_g128 .gpu/golden/
  }
  ls "$dst"
  exit 0
fi

out=${1:-${OUT:-gpu-out/python}}
. scripts/gpu_env.sh

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,compute_cap \
    --format=csv; git log -1 --format='%H %s' 2>/dev/null
  python3 -c 'import sys, numpy, torch; print(sys.version.split()[0],
"numpy", numpy.__version__, "torch", torch.__version__,
"cuda:", torch.cuda.is_available())'
  python3 -c 'import pytest; print("pytest", pytest.__version__)'
} > "$out/machine.txt" 2>&1

step build "$out/build.log" sh -c "cmake -S . -B '$build' -DCMAKE_BUILD_TYPE=Release \
  -DWNA16_BUILD_TESTS=OFF -DWNA16_GOLDEN_DIR='$golden' ${WNA16_CMAKE_ARGS:-} \
  && cmake --build '$build' -j\$(nproc) --target wna16_shared wna16_cli"
lib=$build/libwna16.so.0
export WNA16_CACHE_DIR=$build/kernel-cache
mkdir -p "$WNA16_CACHE_DIR" && chmod 700 "$WNA16_CACHE_DIR"

step example_c "$out/example_c.log" sh -c "cc -std=c17 -O2 -Wall -Wextra -Werror \
  examples/moe_host.c -Iinclude '$lib' -Wl,-rpath,'$build' \
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
  for t in "cuda numpy,cuda test_cuda.py" \
           "api numpy test_abi.py test_api.py" \
           "torch numpy,torch test_torch.py"; do
    set -- $t
    name=$1 mods=$2; shift 2
    step "python_$name" "$out/python_$name.log" \
      sh tests/python/run_pytest.sh "$lib" "$PWD/include" \
      "$golden" "$build/python-cache" "$mods" -v -rs "$@"
  done
  step example_py "$out/example_py.log" env WNA16_LIBRARY="$lib" PYTHONPATH="$PWD/python" "$py" \
    examples/moe_host.py "$golden/gptq_b4_g128" --batches 1,16,64,256 \
    --repeat 5
else
  echo "python: no python3 with numpy and pytest (run --prepare here and" \
       "carry .gpu): the Python steps were not run" | tee -a "$summary"
  failed=1
fi
echo "results in $out (summary.txt)"
exit $failed
