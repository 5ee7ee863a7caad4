#!/bin/sh
# fuzz_ocl.sh WNA16 ARG... - runs `wna16 fuzz ARG... --target ocl` and
# passes when its summary reports no failure and it exits 0; skips (77)
# with the reason when the ocl target cannot run here (no OpenCL loader,
# PoCL or llvm-spirv-15), fails otherwise with the whole output (each
# failure prints its one-line reproducer).
wna16=$1
shift
out=$("$wna16" fuzz --target ocl "$@" 2>&1)
rc=$?
case $out in
*"ocl target unavailable"*)
    printf '%s\n' "$out" | grep -m1 "ocl target unavailable"
    exit 77 ;;
esac
printf '%s\n' "$out" | tail -n 3
if [ $rc -ne 0 ]; then
    printf '%s\n' "$out"
    echo "wna16 fuzz exited $rc"
    exit 1
fi
printf '%s\n' "$out" | grep -Eq "^wna16 fuzz: [0-9]+ (moe )?cases .* 0 skipped, 0 failed$" || {
    echo "no summary line with 0 failed"
    exit 1
}
