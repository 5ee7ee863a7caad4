#!/bin/sh
# build.sh BUILD_DIR GOLDEN_DIR [CC] - builds tests/host/test_threads.c and
# the wna16 library under ThreadSanitizer (this folder's CMakeLists.txt)
# into BUILD_DIR with CC (default: clang-19, else gcc). CTest runs it once
# before host_tsan_threads (the fixture wna16_tsan). Exits 77 (skipped)
# when no compiler here can link -fsanitize=thread.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$1 golden=$2 cc=${3:-}
if [ -z "$cc" ]; then
  if command -v clang-19 >/dev/null 2>&1; then cc=clang-19; else cc=cc; fi
fi
mkdir -p "$out" || exit 1
probe="$out/probe"
printf '%s\n' '#include <pthread.h>' 'static int x;' \
  'static void *f(void *a) { x = 1; return a; }' \
  'int main(void) { pthread_t t; pthread_create(&t, 0, f, 0);' \
  '  pthread_join(t, 0); return x - 1; }' > "$probe.c"
if ! "$cc" -fsanitize=thread "$probe.c" -o "$probe" > "$probe.log" 2>&1 ||
   ! "$probe" >> "$probe.log" 2>&1; then
  cat "$probe.log"
  echo "SKIP: $cc cannot build and run -fsanitize=thread programs"
  exit 77
fi
cmake -S "$here" -B "$out" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWNA16_GOLDEN_DIR="$golden" \
  > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$out" -j"$jobs" --target test_threads
