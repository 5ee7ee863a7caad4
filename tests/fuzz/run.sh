#!/bin/sh
# run.sh HARNESS WORK SECONDS RUNS [DICT|-] SEED_DIR... - runs a libFuzzer
# harness for at most SECONDS seconds and RUNS inputs, from the seeds in
# SEED_DIRs (read only) plus what earlier runs found in WORK/corpus (the
# corpus it grows), with the dictionary DICT ("-": none). A crash, a
# sanitizer report, a leak or a timeout fails (the input lands in
# WORK/crash-*); exits 77 when the harness was not built (build.sh
# skipped).
set -u
bin=$1 work=$2 secs=$3 runs=$4 dict=$5
shift 5
if [ ! -x "$bin" ]; then
  echo "SKIP: $bin not built (no clang-19 with libFuzzer)"
  exit 77
fi
mkdir -p "$work/corpus" || exit 1
set -- -max_total_time="$secs" -runs="$runs" -timeout=20 -rss_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/" \
  "$work/corpus" "$@"
[ "$dict" != - ] && set -- -dict="$dict" "$@"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  exec "$bin" "$@"
