#!/bin/sh
# gen_moe_cuda_nvcc.sh WNA16 NVCC WORKDIR - `wna16 gen --kind moe --target
# cuda` prints self-contained translation units: nvcc compiles them as they
# are, with the flags the command's help gives (a wgmma unit: sm_90a's
# arch-specific target, and a plain -arch=sm_90a stops at the template's
# #error naming those flags). Prints "SKIP: ..." without nvcc.
set -u
W=$1 NVCC=$2 D=$3
if [ ! -x "$NVCC" ]; then echo "SKIP: no nvcc at $NVCC"; exit 0; fi
rm -rf "$D" && mkdir -p "$D" || exit 1
n=0
# unit NAME NVCC-ARCH-FLAGS GEN-ARGS...
unit() {
  name=$1 arch=$2; shift 2
  "$W" gen --kind moe --target cuda "$@" > "$D/$name.cu" ||
    { echo "FAIL: wna16 gen $* (exit $?)"; exit 1; }
  # shellcheck disable=SC2086 # arch is a list of flags
  "$NVCC" -std=c++17 $arch -c "$D/$name.cu" -o "$D/$name.o" \
    > "$D/$name.log" 2>&1 ||
    { echo "FAIL: nvcc $arch $D/$name.cu"; head -20 "$D/$name.log"; exit 1; }
  n=$((n + 1))
}
MIX="--hidden 4096 --intermediate 14336 --experts 8 --topk 2"
unit decode_w13 -arch=sm_80 --to marlin --bits 4 --group-size 128
unit zp_ao_w2 -arch=sm_80 --to marlin --bits 4 --group-size 128 \
  --zero-point --act-order --unit w2
# shellcheck disable=SC2086
unit bm24_w2 -arch=sm_80 --to marlin --bits 4 --group-size 128 $MIX \
  --tokens 64 --unit w2
unit b8_gelu_w13 -arch=sm_80 --to batched_marlin --bits 8 --group-size -1 \
  --dtype F16 --activation gelu --tokens 256
# shellcheck disable=SC2086
unit wgmma_w13 "-gencode arch=compute_90a,code=sm_90a" --to marlin --bits 4 \
  --group-size 128 $MIX --tokens 4096 --sm 90
unit aux -arch=sm_80 --to marlin --unit aux --dtype F16
unit rt_w2 -arch=sm_80 --to marlin --bits 4 --group-size 128 --self-route \
  --unit w2
unit ss_rt_w13 -arch=sm_80 --to marlin --bits 4 --group-size 128 --dtype F16 \
  --split-sums --self-route
unit decode -arch=sm_80 --to marlin --bits 4 --group-size 128 --zero-point \
  --unit decode
grep -q "_wg" "$D/wgmma_w13.cu" || { echo "FAIL: not a wgmma unit"; exit 1; }
if "$NVCC" -std=c++17 -arch=sm_90a -c "$D/wgmma_w13.cu" -o "$D/x.o" \
     > "$D/x.log" 2>&1; then
  echo "FAIL: -arch=sm_90a compiled a wgmma unit"; exit 1
fi
grep -q "compiles for sm_90a only.*compute_90a,code=sm_90a" "$D/x.log" ||
  { echo "FAIL: no #error naming the flags"; head -5 "$D/x.log"; exit 1; }
echo "nvcc compiled $n units; -arch=sm_90a refused the wgmma unit by name"
