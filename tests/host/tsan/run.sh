#!/bin/sh
# run.sh TEST_THREADS - runs the ThreadSanitizer build of test_threads: a
# race report fails it (exit 66), as does a failed check; 77 when
# build.sh skipped (no TSan here) or the test skips.
set -u
bin=$1
if [ ! -x "$bin" ]; then
  echo "SKIP: $bin not built (no compiler with ThreadSanitizer)"
  exit 77
fi
TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1} \
  exec "$bin"
