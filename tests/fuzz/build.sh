#!/bin/sh
# build.sh BUILD_DIR [CC] - builds the libFuzzer harnesses (tests/fuzz/
# harness/, a project of its own) with CC (default clang-19) into
# BUILD_DIR. CTest runs it once before the fuzz_libfuzzer_* tests (the
# fixture wna16_libfuzzer). Exits 77 (skipped) when CC is missing or
# cannot link -fsanitize=fuzzer (Debian: clang-19 and libclang-rt-19-dev).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$1
cc=${2:-clang-19}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "SKIP: no $cc (install clang-19 and libclang-rt-19-dev)"
  exit 77
fi
mkdir -p "$out" || exit 1
probe="$out/probe"
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)' \
  '{ return d && n > 1000000 ? 1 : 0; }' > "$probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" \
     > "$probe.log" 2>&1; then
  cat "$probe.log"
  echo "SKIP: $cc cannot link -fsanitize=fuzzer (install libclang-rt-19-dev)"
  exit 77
fi
cmake -S "$here/harness" -B "$out" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$out" -j"$jobs" --target fuzz_spec fuzz_safetensors fuzz_config
