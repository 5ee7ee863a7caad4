#!/usr/bin/env bash
# `wna16 pack` and the runtime's use of packs, end to end on the CPU.
#
# usage: pack_cli.sh WNA16 WORKDIR CASE [WNA16_NOLLVM]
#   setup        builds tests/pack/small.json into WORKDIR/small.w16pack and
#                a GPTQ checkpoint (make_checkpoint.py) in WORKDIR/ckpt
#   reproducible the same manifest built again (other thread counts) gives
#                the same bytes
#   list, verify, extract, manifest_errors, usage
#   run_jit_off      wna16 run from the pack with JIT disabled: OK, no kernel
#                    compiled, every kernel from the pack
#   run_jit_off_nopack   the same without the pack: fails naming a kernel
#   repack_jit_off   wna16 repack from the pack, JIT disabled: the same bytes
#                    as a JIT repack
#   repack_jit_off_nopack
#   damaged      an entry damaged: said once, compiled instead; verify fails
#   not_a_pack   WNA16_PACK_PATH naming a file that is not a pack
#   golden       every golden checkpoint repacked from a pack, JIT off, and
#                the act-order one's fused MoE run from it
#   cuda         CUDA entries by NVRTC, no GPU needed (skipped without NVRTC)
#   cuda_moe     the tensor-core fused MoE's units (cuda_moe.json) into
#                WORKDIR/cuda_moe.w16pack: list, verify, the same bytes
#                twice (skipped without NVRTC; test_pack_cuda_units then
#                looks them up by request)
#   nollvm       the command built without LLVM and CUDA (WNA16_NOLLVM):
#                no libLLVM loaded; runs and repacks from the pack; without
#                it the cpu target is unavailable, saying why
# Each case prints what it checked and exits 0, or 1 with the reason.
set -uo pipefail
wna16=$1 work=$2 case=$3 nollvm=${4:-}
src=$(cd "$(dirname "$0")" && pwd)
manifest=$src/small.json
pack=$work/small.w16pack
ckpt=$work/ckpt
fail() { echo "FAIL: $*"; exit 1; }
# a kernel cache of each case's own, so that nothing comes from another
fresh_cache() { rm -rf "$work/cache.$case"; export WNA16_CACHE_DIR=$work/cache.$case; }
unset WNA16_PACK_PATH WNA16_JIT

case "$case" in
setup)
  rm -rf "$work" && mkdir -p "$work" || fail "mkdir $work"
  python3 "$src/../cli/make_checkpoint.py" "$ckpt" 1 4 256 128 || fail "make_checkpoint"
  "$wna16" pack build "$manifest" -o "$pack" 2> "$work/build.log" || { cat "$work/build.log"; fail "pack build"; }
  cat "$work/build.log"
  grep -q "wrote $pack: 12 entries" "$work/build.log" || fail "expected 12 entries"
  grep -q "kernels compiled (100%)" "$work/build.log" || fail "no progress line"
  echo "ok: $pack" ;;
reproducible)
  "$wna16" pack build "$manifest" -o "$work/again.w16pack" -j 1 --quiet || fail "rebuild"
  cmp "$pack" "$work/again.w16pack" || fail "a second build differs"
  echo "ok: byte-identical ($(stat -c %s "$pack") bytes)" ;;
list)
  out=$("$wna16" pack list "$pack") || fail "list: $out"
  echo "$out" | head -5
  echo "$out" | grep -q "^pack $pack (ci-small): format 1, 12 entries" || fail "header"
  echo "$out" | grep -Eq "^ +[0-9]+  cpu +x86-64-v3 +[0-9]+  gptq-to-triton +wna16_repack_gptq_to_triton_w13_qweight_b4_g128_zp0$" || fail "an entry line"
  [ "$(echo "$out" | grep -c ' cpu  ')" = 12 ] || fail "12 cpu entries"
  json=$("$wna16" pack list "$pack" --json) || fail "list --json"
  echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["entry_count"] == 12 and len(d["entries"]) == 12, d["entry_count"]
assert d["generator_matches"] is True
assert {e["family"] for e in d["entries"]} == {"gptq-to-triton", "triton-moe"}
assert all(e["target"] == "cpu" and e["arch"] == "x86-64-v3" and e["bytes"] > 0 for e in d["entries"])
' || fail "list --json content"
  echo "ok: list, list --json" ;;
verify)
  out=$("$wna16" pack verify "$pack") || fail "verify: $out"
  echo "$out" | tail -3
  echo "$out" | grep -q "12 entries: 12 intact, 0 damaged; loaded here: 12, failed to load: 0" || fail "verify counts"
  json=$("$wna16" pack verify "$pack" --json) || fail "verify --json"
  echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["ok"] is True and d["intact"] == 12 and d["loaded"] == 12 and d["problems"] == [], d
' || fail "verify --json content"
  echo "ok: verify, verify --json" ;;
extract)
  "$wna16" pack extract "$pack" wna16_moe_input_triton_b4_g128_zp0_silu_f16_bm1 -o "$work/input.so" || fail "extract by name"
  [ "$(head -c 4 "$work/input.so" | od -An -c | tr -d ' ')" = '177ELF' ] || fail "not an ELF file"
  readelf -h "$work/input.so" 2>/dev/null | grep -q "DYN" || fail "not a shared object"
  "$wna16" pack extract "$pack" 0 -o "$work/e0.bin" || fail "extract by index"
  out=$("$wna16" pack extract "$pack" no_such_kernel -o "$work/x" 2>&1); rc=$?
  [ $rc = 1 ] && echo "$out" | grep -q "no entry 'no_such_kernel'" || fail "missing entry: $rc $out"
  echo "ok: extract" ;;
manifest_errors)
  bad=$work/bad.json
  check() { # JSON EXPECTED
    printf '%s' "$1" > "$bad"
    out=$("$wna16" pack build "$bad" -o "$work/bad.w16pack" 2>&1); rc=$?
    [ $rc = 1 ] || fail "exit $rc for $1: $out"
    echo "$out" | grep -qF -- "$2" || fail "expected '$2', got: $out"
    [ ! -e "$work/bad.w16pack" ] || fail "a pack was written"
    echo "refused: $out"
  }
  base='"targets": {"cpu": ["x86-64-v3"]}, "models": [{"name": "m", "experts": 2, "hidden": 256, "intermediate": 128, "topk": 1}]'
  check "{$base, \"families\": [{\"name\": \"f\", \"kind\": \"repack\", \"models\": \"m\", \"from\": \"gptq\", \"to\": \"triton\", \"bits\": [4, 5]}]}" "$bad: \$.families[0].bits[1]: 5 is not one of 4, 8"
  check "{$base, \"families\": [{\"name\": \"f\", \"kind\": \"repack\", \"models\": \"m\", \"from\": \"gptq\", \"to\": \"tritonx\"}]}" "\$.families[0].to: no backend spec named 'tritonx'"
  check "{$base, \"families\": [{\"name\": \"f\", \"kind\": \"moe\", \"models\": \"m\", \"backend\": \"triton\", \"colour\": 1}]}" "\$.families[0].colour: unknown key"
  check "{$base, \"families\": [{\"name\": \"f\", \"kind\": \"moe\", \"models\": [\"m\", \"n\"], \"backend\": \"triton\"}]}" "\$.families[0].models[1]: no model named 'n'"
  check "{\"targets\": {\"cpu\": [\"x86-64-v9\"]}, \"models\": [{\"name\": \"m\", \"experts\": 2, \"hidden\": 256, \"intermediate\": 128, \"topk\": 1}], \"families\": [{\"name\": \"f\", \"kind\": \"moe\", \"models\": \"m\", \"backend\": \"triton\"}]}" "no pack architecture 'x86-64-v9'"
  check "{\"targets\": {\"gpu\": [\"sm_80\"]}}" "\$.targets.gpu: no target 'gpu'"
  check "{$base, \"families\": [{\"name\": \"f\", \"kind\": \"moe\", \"models\": \"m\", \"backend\": \"triton\", \"activation\": \"swish\"}]}" "\$.families[0].activation: 'swish' is not an activation"
  check "{$base, \"families\": [" "not valid JSON"
  echo "ok: manifest errors name the JSON path" ;;
usage)
  out=$("$wna16" pack build "$manifest" 2>&1); [ $? = 2 ] && echo "$out" | grep -q "build needs -o" || fail "no -o: $out"
  out=$("$wna16" pack frob 2>&1); [ $? = 2 ] && echo "$out" | grep -q "unknown subcommand 'frob'" || fail "subcommand: $out"
  "$wna16" pack --help | grep -q "^usage: wna16 pack build MANIFEST.json -o NAME.w16pack" || fail "--help"
  out=$("$wna16" pack list "$manifest" 2>&1); [ $? = 1 ] && echo "$out" | grep -q "not a wna16 kernel pack" || fail "list of a non-pack: $out"
  echo "ok: usage" ;;
run_jit_off)
  fresh_cache
  out=$(WNA16_JIT=0 WNA16_PACK_PATH=$pack "$wna16" run "$ckpt" --target cpu --json 2>&1) || fail "run: $out"
  echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert d["ok"] is True, d
assert d["kernels_from_packs"] > 0, d
' || fail "run --json: $out"
  [ -z "$(find "$WNA16_CACHE_DIR" -name '*.wk' 2>/dev/null)" ] || fail "kernels were compiled into the cache"
  echo "ok: wna16 run from the pack with WNA16_JIT=0" ;;
run_jit_off_nopack)
  fresh_cache
  out=$(WNA16_JIT=0 "$wna16" run "$ckpt" --target cpu 2>&1); rc=$?
  [ $rc = 1 ] || fail "exit $rc: $out"
  echo "$out" | grep -Eq "wna16: kernel wna16_[a-z0-9_]+ \(cpu\): in no kernel pack of this context .* and JIT compilation is disabled \(WNA16_JIT=0" || fail "message: $out"
  echo "ok: $(echo "$out" | grep 'JIT compilation is disabled' | head -1)" ;;
repack_jit_off)
  fresh_cache
  WNA16_JIT=0 WNA16_PACK_PATH=$pack "$wna16" repack "$ckpt" --to triton --target cpu -o "$work/packed.safetensors" > "$work/repack1.log" 2>&1 || { cat "$work/repack1.log"; fail "repack from the pack"; }
  export WNA16_CACHE_DIR=$work/cache.$case.jit
  "$wna16" repack "$ckpt" --to triton --target cpu -o "$work/jit.safetensors" > "$work/repack2.log" 2>&1 || { cat "$work/repack2.log"; fail "JIT repack"; }
  cmp "$work/packed.safetensors" "$work/jit.safetensors" || fail "pack and JIT repacks differ"
  echo "ok: wna16 repack from the pack with WNA16_JIT=0, same bytes as JIT" ;;
repack_jit_off_nopack)
  fresh_cache
  out=$(WNA16_JIT=0 "$wna16" repack "$ckpt" --to triton --target cpu -o "$work/nopack.safetensors" 2>&1); rc=$?
  [ $rc = 1 ] || fail "exit $rc: $out"
  echo "$out" | grep -q "JIT compilation is disabled" || fail "message: $out"
  [ ! -e "$work/nopack.safetensors" ] || fail "an output was left"
  echo "ok: refused without the pack" ;;
damaged)
  fresh_cache
  cp "$pack" "$work/damaged.w16pack"
  # damage an entry the repack below reads (gptq -> triton's w13 codes):
  # its bytes, as `pack extract` gives them, found in the file and the
  # last one changed (keys carry the generator's fingerprint, so which
  # entry comes last in key order moves with every change to gen/)
  want=$("$wna16" pack list "$pack" | awk '/wna16_repack_gptq_to_triton_w13_qweight/ {print $NF; exit}')
  [ -n "$want" ] || fail "no gptq -> triton w13_qweight entry in the pack"
  "$wna16" pack extract "$pack" "$want" --target cpu --arch x86-64-v3 -o "$work/entry.bin" || fail "extract $want"
  python3 - "$work/damaged.w16pack" "$work/entry.bin" <<'PY' || fail "entry $want not found once in the pack's bytes"
import sys
pack = bytearray(open(sys.argv[1], 'rb').read())
entry = open(sys.argv[2], 'rb').read()
at = pack.find(entry)
assert at >= 0 and pack.find(entry, at + 1) < 0
pack[at + len(entry) - 1] ^= 0x5a
open(sys.argv[1], 'wb').write(pack)
PY
  out=$("$wna16" pack verify "$work/damaged.w16pack" 2>&1); rc=$?
  [ $rc = 1 ] && echo "$out" | grep -q "damaged (checksum mismatch)" && echo "$out" | grep -q "^FAILED$" || fail "verify: $rc $out"
  name=$(echo "$out" | sed -n 's/^entry [0-9]* \([a-z0-9_]*\) (cpu x86-64-v3): damaged.*/\1/p')
  [ "$name" = "$want" ] || fail "verify names '$name', not $want: $out"
  out=$(WNA16_PACK_PATH=$work/damaged.w16pack "$wna16" repack "$ckpt" --to triton --target cpu -o "$work/d.safetensors" 2>&1); rc1=$?
  # --backend triton: the pack's layout (on an AVX512-VNNI host `run`
  # would run selection's cpu layout with its dedicated kernels)
  out2=$(WNA16_PACK_PATH=$work/damaged.w16pack "$wna16" run "$ckpt" --target cpu --backend triton 2>&1); rc2=$?
  all="$out
$out2"
  n=$(echo "$all" | grep -c "kernel pack $work/damaged.w16pack: entry $name (cpu x86-64-v3) is damaged (checksum mismatch); compiling the kernel instead")
  # repack or run (whichever uses the entry) says it, once per process
  [ $rc1 = 0 ] && [ $rc2 = 0 ] && [ "$n" -ge 1 ] && [ "$n" -le 2 ] || fail "fallback: $rc1 $rc2 $n: $all"
  fresh_cache # nothing compiled before: the damaged kernel is nowhere else
  out=$(WNA16_JIT=0 WNA16_PACK_PATH=$work/damaged.w16pack "$wna16" run "$ckpt" --target cpu 2>&1 ; echo "exit=$?")
  if echo "$out" | grep -q "entry $name"; then
    echo "$out" | grep -q "exit=1" && echo "$out" | grep -q "JIT compilation is disabled, so the kernel fails" || fail "JIT off: $out"
  fi
  echo "ok: damaged entry $name refused once and compiled instead" ;;
not_a_pack)
  fresh_cache
  out=$(WNA16_PACK_PATH=$manifest "$wna16" run "$ckpt" --target cpu 2>&1); rc=$?
  [ $rc = 1 ] && echo "$out" | grep -q "WNA16_PACK_PATH: $manifest: not a wna16 kernel pack" || fail "$rc: $out"
  echo "ok: $(echo "$out" | grep -m1 'not a wna16 kernel pack')" ;;
cuda)
  # CUDA entries compiled by NVRTC without a GPU: CUBINs for sm_80 and
  # sm_90a, PTX for compute_80; the same bytes twice
  out=$("$wna16" pack build "$src/cuda.json" -o "$work/cuda.w16pack" --quiet 2>&1); rc=$?
  if [ $rc != 0 ]; then
    if echo "$out" | grep -Eq "no target 'cuda'|NVRTC|libnvrtc"; then echo "SKIP: $out"; exit 0; fi
    fail "cuda pack: $out"
  fi
  "$wna16" pack build "$src/cuda.json" -o "$work/cuda2.w16pack" --quiet -j 1 || fail "rebuild"
  cmp "$work/cuda.w16pack" "$work/cuda2.w16pack" || fail "two builds differ"
  list=$("$wna16" pack list "$work/cuda.w16pack") || fail "list"
  for a in sm_80 sm_90a compute_80; do
    [ "$(echo "$list" | grep -c "  cuda   $a ")" = 6 ] || fail "6 entries for $a: $list"
  done
  # the blob: u64 CUBIN size, u64 PTX size, then the CUBIN (an ELF file)
  # or the PTX text
  "$wna16" pack extract "$work/cuda.w16pack" wna16_repack_gptq_to_marlin_w13_qzeros_b4_g128_zp0 --target cuda --arch sm_80 -o "$work/sm80.bin" 2>/dev/null || fail "extract sm_80"
  [ "$(dd if="$work/sm80.bin" bs=1 skip=16 count=4 status=none | od -An -c | tr -d ' ')" = '177ELF' ] || fail "sm_80 entry is not a CUBIN"
  "$wna16" pack extract "$work/cuda.w16pack" wna16_repack_gptq_to_marlin_w13_qzeros_b4_g128_zp0 --target cuda --arch compute_80 -o "$work/ptx.bin" 2>/dev/null || fail "extract compute_80"
  [ "$(head -c 8 "$work/ptx.bin" | od -An -tu8 | tr -d ' ')" = 0 ] && grep -aq "^.target sm_80" "$work/ptx.bin" || fail "compute_80 entry is not PTX alone"
  out=$("$wna16" pack verify "$work/cuda.w16pack") || fail "verify: $out"
  echo "$out" | grep -q "18 entries: 18 intact" || fail "verify: $out"
  echo "ok: 18 CUDA entries (sm_80, sm_90a CUBINs, compute_80 PTX), reproducible" ;;
cuda_moe)
  # the fused MoE's units for one layer (E=4, H=256, I=128, 4-bit g128,
  # bfloat16, silu): both GEMMs at each of the marlin tiling's 12 block_m
  # rows (6 mma.sync, 6 wgmma), GEMM 1 also with its split-K sums on the 4
  # mma.sync rows that split this K, the units that route their own row
  # block (at most 32 slots over 4 experts: the block_m 8 and 16 rows;
  # GEMM 1 with and without its split-K sums, GEMM 2), the 3 routing
  # pieces: 37 units, the
  # mma.sync ones and the pieces for sm_90 (not again for sm_90a), the
  # wgmma ones for sm_90a alone; the standard and batched formats share them
  rm -f "$work/cuda_moe.w16pack"
  out=$("$wna16" pack build "$src/cuda_moe.json" -o "$work/cuda_moe.tmp" --quiet 2>&1); rc=$?
  if [ $rc != 0 ]; then
    if echo "$out" | grep -Eq "no target 'cuda'|NVRTC|libnvrtc"; then echo "SKIP: $out"; exit 0; fi
    fail "cuda moe pack: $out"
  fi
  "$wna16" pack build "$src/cuda_moe.json" -o "$work/cuda_moe2.tmp" --quiet -j 1 || fail "rebuild"
  cmp "$work/cuda_moe.tmp" "$work/cuda_moe2.tmp" || fail "two builds differ"
  list=$("$wna16" pack list "$work/cuda_moe.tmp") || fail "list"
  echo "$list" | head -5
  echo "$list" | grep -q "^pack $work/cuda_moe.tmp (ci-cuda-moe): format 1, 37 entries" || fail "header: $list"
  [ "$(echo "$list" | grep -Ec "  cuda   sm_90  +[0-9]+  marlin-moe +w16_moe_(marlin|aux)_")" = 25 ] || fail "25 sm_90 units: $list"
  # the tables' wgmma rows: persistent CTAs up to block_m 96 (K 8192 at
  # most), tail rows above
  [ "$(echo "$list" | grep -Ec "  cuda   sm_90a +[0-9]+  marlin-moe +w16_moe_marlin_w(13_silu|2)_bf16_b4_sym_g[cq]_t32_sbf16_bf16_m(48|64|80|96)n256k64_w8x1_p4_wg_ws_ps$")" = 8 ] || fail "8 persistent wgmma units for sm_90a: $list"
  [ "$(echo "$list" | grep -Ec "  cuda   sm_90a +[0-9]+  marlin-moe +w16_moe_marlin_w(13_silu|2)_bf16_b4_sym_g[cq]_t32_sbf16_bf16_m(112|128)n256k64_w8x1_p4_wg_ws_tm32$")" = 4 ] || fail "4 wgmma units with tail rows for sm_90a: $list"
  echo "$list" | grep -q "_wg.*" && ! echo "$list" | grep -q " sm_90  .*_wg" || fail "a wgmma unit for sm_90"
  for u in w16_moe_aux_route_bf16 w16_moe_aux_finalize_small_bf16 w16_moe_aux_gather_finalize_bf16 \
           w16_moe_marlin_w13_silu_bf16_b4_sym_g128_t32_sbf16_bf16_m8n256k128_w4x1_p3_o4_ss \
           w16_moe_marlin_w13_silu_bf16_b4_sym_g128_t32_sbf16_bf16_m8n256k128_w4x1_p3_o4_ss_rt \
           w16_moe_marlin_w2_bf16_b4_sym_gc_t32_sbf16_bf16_m16n256k128_w4x1_p3_o3_rt; do
    echo "$list" | grep -q " $u$" || fail "no unit $u"
  done
  json=$("$wna16" pack list "$work/cuda_moe.tmp" --json) || fail "list --json"
  echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["entry_count"] == 37 and d["generator_matches"] is True, d["entry_count"]
assert all(e["target"] == "cuda" and e["family"] == "marlin-moe" and e["bytes"] > 1000 for e in d["entries"])
assert len({e["key"] for e in d["entries"]}) == 37
' || fail "list --json content"
  out=$("$wna16" pack verify "$work/cuda_moe.tmp") || fail "verify: $out"
  echo "$out" | grep -q "37 entries: 37 intact, 0 damaged" || fail "verify: $out"
  "$wna16" pack extract "$work/cuda_moe.tmp" w16_moe_aux_route_bf16 -o "$work/route.bin" 2>/dev/null || fail "extract"
  [ "$(dd if="$work/route.bin" bs=1 skip=16 count=4 status=none | od -An -c | tr -d ' ')" = '177ELF' ] || fail "not a CUBIN"
  mv "$work/cuda_moe.tmp" "$work/cuda_moe.w16pack"
  echo "ok: 37 CUDA fused-MoE units (25 for sm_90, 12 wgmma for sm_90a), listed, verified, reproducible" ;;
golden)
  # every golden checkpoint of these shapes (../shared/golden) repacked on
  # the CPU into Triton's and Marlin's layouts from a pack, JIT off: the
  # manifest's expansion makes the requests the runtime makes for real
  # checkpoints (formats, dtypes, act order, zero points, what is stored)
  g=${WNA16_GOLDEN_DIR:-}
  [ -d "$g/gptq_b4_g128" ] || { echo "SKIP: no golden checkpoints ($g)"; exit 0; }
  "$wna16" pack build "$src/golden.json" -o "$work/golden.w16pack" --quiet || fail "golden pack"
  n=0
  for c in gptq_b4_g128 gptq_b4_g128_actorder gptq_b4_g128_bf16 gptq_b8_g128 awq_b4_g128 awq_b4_g128_bf16 ct_b4_g32; do
    for to in triton marlin; do
      [ "$c/$to" = gptq_b4_g128_actorder/triton ] && continue # triton holds no act order
      fresh_cache
      out=$(WNA16_JIT=0 WNA16_PACK_PATH=$work/golden.w16pack "$wna16" repack "$g/$c" --to "$to" --target cpu -o "$work/golden.safetensors" 2>&1) || fail "$c to $to: $out"
      n=$((n + 1))
    done
  done
  # the act-order layer's fused MoE on the CPU (Marlin's sorted-K layout,
  # the generated kernels reading g_idx and the sort indices) from the
  # pack too: nothing compiled
  fresh_cache
  out=$(WNA16_JIT=0 WNA16_PACK_PATH=$work/golden.w16pack "$wna16" run "$g/gptq_b4_g128_actorder" --target cpu --json 2>&1) || fail "run act order: $out"
  echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert d["ok"] is True and d["kernels_from_packs"] > 0, d
' || fail "run act order --json: $out"
  [ -z "$(find "$WNA16_CACHE_DIR" -name '*.wk' 2>/dev/null)" ] || fail "act order: kernels were compiled"
  echo "ok: $n golden repacks and the act-order layer's fused MoE from the pack with JIT disabled" ;;
nollvm)
  [ -x "$nollvm" ] || fail "no command built without LLVM: $nollvm"
  if command -v ldd > /dev/null; then
    ldd "$nollvm" | grep -qi llvm && fail "$nollvm links LLVM: $(ldd "$nollvm" | grep -i llvm)"
  fi
  fresh_cache
  out=$("$nollvm" run "$ckpt" --target cpu 2>&1); rc=$?
  [ $rc = 1 ] && echo "$out" | grep -q "cpu target unavailable: built without LLVM 19.*no kernel pack of this context holds CPU kernels" || fail "without a pack: $rc $out"
  WNA16_PACK_PATH=$pack "$nollvm" run "$ckpt" --target cpu > "$work/nollvm_run.log" 2>&1 || { cat "$work/nollvm_run.log"; fail "run without LLVM"; }
  grep -q "result: OK" "$work/nollvm_run.log" || fail "run result: $(cat "$work/nollvm_run.log")"
  WNA16_PACK_PATH=$pack "$nollvm" repack "$ckpt" --to triton --target cpu -o "$work/nollvm.safetensors" > /dev/null 2>&1 || fail "repack without LLVM"
  "$wna16" repack "$ckpt" --to triton --target cpu -o "$work/llvm.safetensors" > /dev/null 2>&1 || fail "JIT repack"
  cmp "$work/nollvm.safetensors" "$work/llvm.safetensors" || fail "repacks differ"
  grep "result:\|fused MoE" "$work/nollvm_run.log"
  echo "ok: run and repack with no LLVM in the process" ;;
*) echo "pack_cli.sh: unknown case '$case'"; exit 2 ;;
esac
