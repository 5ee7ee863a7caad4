#!/usr/bin/env bash
# Kernel packs on a GPU machine with NVRTC out of the search path (issue 23,
# step 5): a CUBIN pack built here (NVRTC present), then used by processes
# that cannot load NVRTC. Run on the H200 by the lead; prints a report and
# exits 1 at the first check that fails.
#
# usage: scripts/gpu_pack.sh BUILD_DIR [WORK_DIR]
#   BUILD_DIR  a configured and built tree (cmake -S . -B build && cmake
#              --build build -j): uses BUILD_DIR/wna16
#   WORK_DIR   scratch (default: BUILD_DIR/gpu-pack)
#
# NVRTC is hidden from the checked processes by a private mount namespace
# (unshare -m, root; or unshare -rm where user namespaces are allowed) in
# which every libnvrtc.so* the loader could find is covered by an empty
# file: nothing changes outside those processes. Checks:
#   1. the pack builds (CUBINs for sm_80, sm_90, sm_90a, PTX for
#      compute_80) and `wna16 pack verify` loads the entries this GPU runs;
#   2. in the namespace, NVRTC is really gone: a CUDA repack without the
#      pack fails saying so;
#   3. in the namespace, with WNA16_JIT=0 and WNA16_PACK_PATH, `wna16
#      repack --target cuda` succeeds and writes the same bytes as the
#      reference repack (--target reference); the sm_80 entries are said
#      skipped once (WNA16_LOG_LEVEL=info);
#   4. the same with the PTX entries only (a pack without sm_90 CUBINs:
#      the driver compiles the PTX; still no NVRTC);
#   5. `wna16 run --target cuda` (the embedded default: Qwen3-30B-A3B's
#      layer, GPTQ 4-bit g128, bfloat16) in the namespace with WNA16_JIT=0
#      from a pack of packs/default.json's CUDA families (the repack
#      kernels and the tensor-core fused MoE's units: CUBINs for sm_80,
#      sm_89, sm_90, sm_90a and compute_80 PTX): result OK at 16, 256 and
#      512 tokens (routing blocks 8 and 24 on mma.sync, 48 on wgmma), every
#      kernel from the pack (the run's lines say so), nothing compiled;
#   6. the same run on the check's checkpoint with the first pack, which
#      holds no fused-MoE unit: it fails naming the unit and that JIT is
#      off, no crash.
set -uo pipefail
build=${1:?usage: scripts/gpu_pack.sh BUILD_DIR [WORK_DIR]}
work=${2:-$build/gpu-pack}
wna16=$(cd "$build" && pwd)/wna16
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$wna16" ] || { echo "gpu_pack: no $wna16 (build first)"; exit 2; }
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
say() { echo "== $*"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null)  date: $(date -u +%F)"

# A checkpoint and a manifest for its layer: GPTQ 4-bit g128, 8 experts, a
# float16 model (make_checkpoint.py's torch_dtype): the model's dtype is part
# of every request, so the manifest must name the same one.
python3 "$root/tests/cli/make_checkpoint.py" "$work/ckpt" 1 8 1024 512 || fail "make_checkpoint"
cat > "$work/gpu.json" <<'JSON'
{"name": "gpu-check",
 "targets": {"cuda": ["sm_80", "sm_90", "sm_90a", "compute_80"]},
 "models": [{"name": "ckpt", "experts": 8, "hidden": 1024, "intermediate": 512, "topk": 2, "dtype": "F16"}],
 "families": [
  {"name": "gptq-to-marlin", "kind": "repack", "models": "ckpt", "from": "gptq",
   "to": ["marlin", "batched_marlin"], "bits": 4, "group_size": 128, "scale_dtype": "F16"}]}
JSON
sed 's/"sm_80", "sm_90", "sm_90a", "compute_80"/"compute_80"/' "$work/gpu.json" > "$work/ptx.json"

say "1. build the packs (NVRTC present) and verify them on this GPU"
/usr/bin/time -f "build: %e s" "$wna16" pack build "$work/gpu.json" -o "$work/gpu.w16pack" 2>&1 | tail -3 || fail "pack build"
"$wna16" pack build "$work/ptx.json" -o "$work/ptx.w16pack" --quiet || fail "PTX pack build"
"$wna16" pack list "$work/gpu.w16pack" | head -4
"$wna16" pack verify "$work/gpu.w16pack" | tail -4
"$wna16" pack verify "$work/gpu.w16pack" > /dev/null || fail "verify"
ls -l "$work"/*.w16pack

# The reference repack (no compiler at all) to compare with.
"$wna16" repack "$work/ckpt" --to marlin --target reference -o "$work/ref.safetensors" > /dev/null 2>&1 || fail "reference repack"
# The files differ in their metadata's "target"; the tensors must not.
same_tensors() { # same_tensors A B: every tensor's dtype, shape and bytes
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
print("tensors: %d, differing: %s" % (len(a), ", ".join(bad) or "none"))
sys.exit(1 if bad else 0)
PY
}

# Runs "$@" with every libnvrtc the loader could find covered by an empty
# file, in a private mount namespace.
libs=$( (ldconfig -p 2>/dev/null | awk '/libnvrtc/ {print $NF}'; ls /usr/local/cuda*/lib*/libnvrtc* /usr/local/cuda*/targets/*/lib/libnvrtc* 2>/dev/null) | sort -u)
no_nvrtc() {
  local cover="" l
  : > "$work/empty"
  for l in $libs; do cover="$cover mount --bind $work/empty $(readlink -f "$l") 2>/dev/null;"; done
  local inner="$cover exec \"\$@\""
  if [ "$(id -u)" = 0 ]; then
    unshare -m sh -c "$inner" sh "$@"
  else
    unshare -rm sh -c "$inner" sh "$@"
  fi
}
no_nvrtc true || fail "cannot make a private mount namespace here (unshare -m needs root, unshare -rm user namespaces)"

say "2. NVRTC is gone in the namespace"
export WNA16_CACHE_DIR=$work/cache-none
out=$(no_nvrtc "$wna16" repack "$work/ckpt" --to marlin --target cuda -o "$work/x.safetensors" 2>&1); rc=$?
echo "$out" | tail -2
[ $rc != 0 ] && echo "$out" | grep -q "NVRTC unavailable" || fail "NVRTC still loads in the namespace (rc $rc)"

say "3. repack --target cuda from the CUBIN pack, JIT off, no NVRTC"
export WNA16_CACHE_DIR=$work/cache-pack
out=$(WNA16_LOG_LEVEL=info WNA16_JIT=0 WNA16_PACK_PATH=$work/gpu.w16pack no_nvrtc "$wna16" repack "$work/ckpt" --to marlin --target cuda -o "$work/pack.safetensors" 2>&1); rc=$?
echo "$out" | grep -E "kernel pack|wrote|NVRTC|error" | head -8
[ $rc = 0 ] || fail "repack from the pack: $out"
same_tensors "$work/pack.safetensors" "$work/ref.safetensors" || fail "pack repack differs from the reference"
echo "$out" | grep -q "entries for sm_80.* are skipped" && echo "sm_80 entries said skipped: yes" || echo "sm_80 entries said skipped: no (check the log above)"
[ -z "$(find "$WNA16_CACHE_DIR" -name '*.wk' 2>/dev/null)" ] || fail "kernels were compiled"
echo "ok: same bytes as the reference, nothing compiled"

say "4. the PTX pack alone (the driver compiles PTX), JIT off, no NVRTC"
export WNA16_CACHE_DIR=$work/cache-ptx
WNA16_JIT=0 WNA16_PACK_PATH=$work/ptx.w16pack no_nvrtc "$wna16" repack "$work/ckpt" --to marlin --target cuda -o "$work/ptx.safetensors" > "$work/ptx.log" 2>&1 || { cat "$work/ptx.log"; fail "repack from PTX"; }
same_tensors "$work/ptx.safetensors" "$work/ref.safetensors" || fail "PTX repack differs"
echo "ok: PTX entries"

say "5. wna16 run --target cuda (the embedded default) from packs/default.json's CUDA kernels, JIT off, no NVRTC"
# default.json's CUDA target and the families that name it (a build
# without LLVM packs no CPU kernels)
python3 - "$root/packs/default.json" "$work/default_cuda.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["name"] = "default-cuda"
d["targets"] = {"cuda": d["targets"]["cuda"]}
d["families"] = [dict(f, targets=["cuda"]) for f in d["families"] if "cuda" in f.get("targets", ["cuda"])]
json.dump(d, open(sys.argv[2], "w"), indent=1)
PY
/usr/bin/time -f "build: %e s" "$wna16" pack build "$work/default_cuda.json" -o "$work/default_cuda.w16pack" 2>&1 | tail -2 || fail "default CUDA pack build"
"$wna16" pack list "$work/default_cuda.w16pack" | awk 'NR > 4 {n[$5]++; b[$5] += $4} END {for (f in n) printf "  %-22s %5d entries %8.2f MB\n", f, n[f], b[f] / 1e6}' | sort
"$wna16" pack verify "$work/default_cuda.w16pack" | tail -2
for t in 16 256 512; do
  export WNA16_CACHE_DIR=$work/cache-run-$t
  WNA16_LOG_LEVEL=info WNA16_JIT=0 WNA16_PACK_PATH=$work/default_cuda.w16pack no_nvrtc "$wna16" run --target cuda --tokens "$t" > "$work/run-$t.log" 2>&1; rc=$?
  grep -E "repack:|kernels:|fused MoE|kernels: w16|first call|result:" "$work/run-$t.log"
  [ $rc = 0 ] && grep -q "result: OK" "$work/run-$t.log" || { cat "$work/run-$t.log"; fail "run --target cuda --tokens $t from the pack (exit $rc)"; }
  grep -Eq "kernels: [1-9][0-9]* from kernel packs, 0 from the kernel cache, 0 compiled" "$work/run-$t.log" || fail "--tokens $t: the repack's kernels did not all come from the pack"
  grep -Eq "units: [1-9][0-9]* from kernel packs, 0 from the kernel cache, 0 compiled by NVRTC" "$work/run-$t.log" || fail "--tokens $t: the fused MoE's units did not all come from the pack"
  [ -z "$(find "$WNA16_CACHE_DIR" -name '*.wk' 2>/dev/null)" ] || fail "--tokens $t: kernels were compiled"
  echo "ok: --tokens $t: result OK, every kernel and unit from the pack, nothing compiled"
done

say "6. a pack without the fused MoE's units, JIT off, no NVRTC: the run names the missing unit"
export WNA16_CACHE_DIR=$work/cache-run
out=$(WNA16_JIT=0 WNA16_PACK_PATH=$work/gpu.w16pack no_nvrtc "$wna16" run "$work/ckpt" --target cuda 2>&1); rc=$?
echo "$out" | tail -2
[ $rc = 1 ] && echo "$out" | grep -Eq "CUDA unit w16_moe_[a-z0-9_]+: in no kernel pack of this context .* JIT compilation is disabled" || fail "expected a refusal naming the unit (exit $rc)"
echo "ok: refused, naming the unit"
echo "gpu_pack: all required checks passed"
