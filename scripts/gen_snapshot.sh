#!/usr/bin/env bash
# Records the text the generator prints (kernel IR, LLVM IR before
# optimization, CUDA C, SPIR-V disassembled) for a fixed list of kernels, so
# that a refactor can show that every kernel is byte for byte what it was.
# The list covers repack kernels (every format into every backend, 4 and 8
# bits, group sizes -1/32/64/128, zero points, act order, biases, 8-bit
# activation variants), the portable fused-MoE kernels (every backend,
# standard and batched, every stage) and the tensor-core CUDA units (marlin
# and batched_marlin, sm_80 and sm_90, decode to prefill tiles).
# A case the generator refuses is recorded too: its message and exit status.
# A change that only rewords comments in templates/ shows as such with
# scripts/snapshot_comment_diff.py BEFORE_DIR AFTER_DIR over two recordings.
#
# usage: scripts/gen_snapshot.sh WNA16 record DIR   write DIR/<case>.txt and DIR/MANIFEST
#        scripts/gen_snapshot.sh WNA16 check FILE    compare with a MANIFEST (exit 1 on a difference)
#        scripts/gen_snapshot.sh WNA16 list          the cases, one a line
# WNA16 is the built `wna16` command. MANIFEST lines are
# "<sha256 of output> <exit status> <case>"; the embedded specs are used
# (WNA16_SPEC_DIR is unset).
set -euo pipefail
unset WNA16_SPEC_DIR
if [ $# -lt 2 ]; then
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
wna16=$1 mode=$2
[ -x "$wna16" ] || { echo "gen_snapshot: $wna16: not an executable" >&2; exit 2; }

# Each case: "<name>|<arguments of wna16 gen>".
cases() {
  local f b t q
  local -a quant=(
    "b4g128|--bits 4 --group-size 128"
    "b8g128|--bits 8 --group-size 128"
    "b4g32zp|--bits 4 --group-size 32 --zero-point"
    "b4gm1|--bits 4 --group-size -1"
    "b4g128act|--bits 4 --group-size 128 --act-order"
    "b8g64zpbias|--bits 8 --group-size 64 --zero-point --bias"
    "b4g32|--bits 4 --group-size 32"
    "b4g32pad|--bits 4 --group-size 32 --hidden 192 --intermediate 96"
  )
  for f in gptq awq compressed_tensors moe_wna16; do
    for b in marlin batched_marlin triton humming flashinfer_trtllm xpu cpu emulation; do
      for q in "${quant[@]}"; do
        for t in ir llvm cuda spirv; do
          echo "repack-$f-$b-${q%%|*}-$t|--kind repack --from $f --to $b --target $t ${q#*|}"
        done
      done
    done
  done
  for t in ir llvm cuda spirv; do
    echo "repack-gptq-marlin-a8int8-$t|--kind repack --from gptq --to marlin --bits 4 --group-size 128 --input-dtype int8 --target $t"
    echo "repack-gptq-marlin-a8fp8-$t|--kind repack --from gptq --to marlin --bits 4 --group-size 128 --input-dtype fp8 --target $t"
    echo "repack-awq-triton-bf16-$t|--kind repack --from awq --to triton --bits 4 --group-size 128 --zero-point --scale-dtype BF16 --target $t"
  done
  local -a mq=(
    "b4g128|--bits 4 --group-size 128"
    "b8g64|--bits 8 --group-size 64"
    "b4g32zp|--bits 4 --group-size 32 --zero-point"
    "b4gm1bias|--bits 4 --group-size -1 --bias"
  )
  for b in marlin batched_marlin triton humming flashinfer_trtllm xpu cpu emulation; do
    for q in "${mq[@]}"; do
      for t in ir llvm cuda spirv; do
        echo "moe-$b-${q%%|*}-$t|--kind moe --to $b ${q#*|} --target $t"
      done
    done
    for t in ir llvm spirv; do
      echo "moe-$b-batched-f16-gelu-$t|--kind moe --to $b --bits 4 --group-size 128 --batched --act-dtype F16 --scale-dtype F16 --activation gelu --target $t"
      echo "moe-$b-swigluoai-bm8-$t|--kind moe --to $b --bits 4 --activation swigluoai --block-m 8 --topk 2 --hidden 384 --intermediate 160 --experts 3 --group-size 32 --target $t"
    done
  done
  local u sm m
  for b in marlin batched_marlin; do
    for sm in 80 90; do
      for m in 1 16 64 512; do
        for u in w13 w2; do
          echo "tc-$b-sm$sm-m$m-$u-b4g128|--kind moe --target cuda --to $b --bits 4 --group-size 128 --unit $u --sm $sm --tokens $m"
        done
      done
      for u in w13 w2; do
        echo "tc-$b-sm$sm-$u-b8g64zp-f16|--kind moe --target cuda --to $b --bits 8 --group-size 64 --zero-point --dtype F16 --unit $u --sm $sm --tokens 32"
        echo "tc-$b-sm$sm-$u-b4g128act-bias|--kind moe --target cuda --to $b --bits 4 --group-size 128 --act-order --bias --unit $u --sm $sm --tokens 8 --hidden 4096 --intermediate 1408 --experts 16"
      done
      for u in aux aux_route aux_finalize_small aux_gather_finalize; do
        echo "tc-$b-sm$sm-$u|--kind moe --target cuda --to $b --bits 4 --group-size 128 --unit $u --sm $sm --activation gelu"
      done
    done
  done
}

record() { # DIR: writes DIR/<case>.txt and DIR/MANIFEST
  # One process for all the cases: `wna16 gen --batch` reads "<case>
  # <arguments>" lines, writes each case's output and messages to
  # DIR/<case>.txt as `wna16 gen <arguments> > DIR/<case>.txt 2>&1` would,
  # and prints "<exit status> <case>" for each (a process a case took 146 s
  # of CPU, most of it loading LLVM's libraries; one process, 9 s). The
  # outputs are hashed by one sha256sum at the end; nothing forks a case.
  out=$1
  mkdir -p "$out"
  local i rc=0 status
  local -a lines names rcs st
  mapfile -t lines < <(cases)
  status=$("$wna16" gen --batch - --batch-dir "$out" \
             < <(printf '%s\n' "${lines[@]/|/ }")) || rc=$?
  # 1: some case failed (its status is on its line); more: the batch did not run
  if [ "$rc" -gt 1 ]; then
    echo "gen_snapshot: wna16 gen --batch exited $rc" >&2
    exit 1
  fi
  mapfile -t st <<< "$status"
  for i in "${!lines[@]}"; do
    names+=("${lines[i]%%|*}")
    status=${st[i]-}
    rcs+=("${status%% *}")
    if [ "$status" != "${rcs[i]} ${names[i]}" ]; then
      echo "gen_snapshot: case $((i + 1)) (${names[i]}): wna16 gen --batch" \
           "reported '$status'" >&2
      exit 1
    fi
  done
  # "<sha256 of output> <exit status> <case>", in the order of the cases
  (cd "$out" && printf '%s.txt\0' "${names[@]}" | xargs -0 sha256sum --) |
    awk -v rcs="${rcs[*]}" '
      BEGIN { n = split(rcs, rc, " ") }
      { name = $2; sub(/^\*/, "", name); sub(/\.txt$/, "", name)
        printf "%s %s %s\n", $1, rc[NR], name }
      END { if (NR != n) { print "gen_snapshot: hashed " NR " of " n " cases" > "/dev/stderr"; exit 1 } }' \
    > "$out/MANIFEST.tmp"
  mv "$out/MANIFEST.tmp" "$out/MANIFEST"
  local ok total
  total=$(wc -l < "$out/MANIFEST")
  ok=$(awk '$2 == 0' "$out/MANIFEST" | wc -l)
  echo "gen_snapshot: $total cases, $ok kernels generated, $((total - ok)) refused; $out/MANIFEST"
}

case "$mode" in
  list) cases | cut -d'|' -f1 ;;
  record) [ $# -eq 3 ] || { echo "gen_snapshot: record needs DIR" >&2; exit 2; }; record "$3" ;;
  check)
    [ $# -eq 3 ] || { echo "gen_snapshot: check needs a MANIFEST file" >&2; exit 2; }
    [ -f "$3" ] || { echo "gen_snapshot: $3: no such file" >&2; exit 2; }
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    record "$tmp" > /dev/null
    if diff -u "$3" "$tmp/MANIFEST" > "$tmp/diff"; then
      echo "gen_snapshot: $(wc -l < "$3") cases byte-identical to $3"
    else
      echo "gen_snapshot: generated text differs from $3:" >&2
      grep '^[-+][0-9a-f]' "$tmp/diff" | head -40 >&2
      exit 1
    fi ;;
  *) echo "gen_snapshot: unknown mode '$mode' (record, check, list)" >&2; exit 2 ;;
esac
