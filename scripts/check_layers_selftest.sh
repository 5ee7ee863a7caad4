#!/bin/sh
# Proves that scripts/check_layers.py catches each kind of violation. It
# writes a small fake repository in a temporary folder (include/, base/,
# spec/, gen/, runtime/{ref,cache,cpu,ze}/, runtime/context.c, tools/) that
# follows the layering, compiles its library files with gcc into the layout
# CMake uses (build/CMakeFiles/wna16.dir/<source>.o, plus a generated
# embedded_specs.c.o that anyone may use), and checks that this clean tree
# passes; then, one copy at a time, it injects an upward include, include
# cycles, a missing include, an upward call, a mutual call and a longer call
# cycle, and checks that each is reported, with the exact line, and nothing
# else. It also checks the usage errors (exit 2) and --help (exit 0).
#
# usage: scripts/check_layers_selftest.sh   (exit 0 pass, 1 fail, 77 skip:
#                                            no gcc/cc, nm or python3)
set -u
here=$(cd "$(dirname "$0")" && pwd)
check="$here/check_layers.py"
CC=${CC:-gcc}
command -v "$CC" >/dev/null 2>&1 || CC=cc
for tool in "$CC" nm python3; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "check_layers_selftest: $tool not found: skipped"; exit 77; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/layers-selftest.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# ---- the clean fake tree ----------------------------------------------------
put() { mkdir -p "$(dirname "$1")"; cat > "$1"; }
clean="$tmp/clean"
put "$clean/include/wna16.h" <<'EOF'
int wna16_version(void);
EOF
put "$clean/base/base.h" <<'EOF'
#include "wna16.h"
#include <stddef.h>
/* #include "runtime/context.h": a comment, not an include */
int w16_base(int x);
EOF
put "$clean/base/base.c" <<'EOF'
#include "base/base.h"
// #include "nowhere.h"
static const char *s = "#include \"nowhere.h\"";
int w16_base(int x) { return x + (int)sizeof s; }
EOF
put "$clean/spec/spec.h" <<'EOF'
#include "base/base.h"
int w16_spec(int x);
EOF
put "$clean/spec/spec.c" <<'EOF'
#include "spec/spec.h"
extern const int w16_embedded;
int w16_spec(int x) { return w16_base(x) + w16_embedded; }
EOF
put "$clean/gen/kir.h" <<'EOF'
#include "spec/spec.h"
int w16_kir(int x);
EOF
put "$clean/gen/kir.c" <<'EOF'
#include "gen/kir.h"
int w16_kir(int x) { return w16_spec(x); }
EOF
put "$clean/runtime/ref/ref.h" <<'EOF'
#include "base/base.h"
int w16_ref(int x);
EOF
put "$clean/runtime/ref/ref.c" <<'EOF'
#include "runtime/ref/ref.h"
int w16_ref(int x) { return w16_base(x); }
EOF
put "$clean/runtime/cache/cache.h" <<'EOF'
#include "gen/kir.h"
int w16_cache(int x);
EOF
put "$clean/runtime/cache/cache.c" <<'EOF'
#include "runtime/cache/cache.h"
int w16_cache(int x) { return w16_kir(x); }
EOF
put "$clean/runtime/cpu/cpu.h" <<'EOF'
#include "runtime/cache/cache.h"
#include "runtime/ref/ref.h"
int w16_cpu(int x);
EOF
put "$clean/runtime/cpu/cpu.c" <<'EOF'
#include "runtime/cpu/cpu.h"
int w16_cpu(int x) { return w16_cache(x) + w16_ref(x); }
EOF
put "$clean/runtime/ze/ze.c" <<'EOF'
#include "runtime/ref/ref.h"
int w16_ze(int x) { return w16_ref(x); }
EOF
put "$clean/runtime/context.c" <<'EOF'
#include "runtime/cpu/cpu.h"
extern int w16_ze(int x);
int w16_ctx_log(int x) { return x; }
int wna16_version(void) { return w16_cpu(1) + w16_ze(2); }
EOF
put "$clean/tools/cli.h" <<'EOF'
#include "wna16.h"
EOF
put "$clean/tools/main.c" <<'EOF'
#include "cli.h"
int main(void) { return wna16_version(); }
EOF
put "$clean/build/embedded_specs.c" <<'EOF'
const int w16_embedded = 3;
EOF

# ---- running the checker on a copy ------------------------------------------
# build DIR: compiles DIR's library files (in a copy, only those that differ
# from the clean tree: the others' objects came with the copy); sets $objs
# to the objects, ;-separated.
build() {
  objs=""
  for src in $(cd "$1" && find base spec gen runtime -name '*.c' | sort) \
             build/embedded_specs.c; do
    obj="$1/build/CMakeFiles/wna16.dir/${src#build/}.o"
    if [ "$1" = "$clean" ] || [ ! -f "$obj" ] \
       || ! cmp -s "$clean/$src" "$1/$src"; then
      mkdir -p "$(dirname "$obj")"
      "$CC" -std=c17 -O0 -c -I"$1" -I"$1/include" "$1/$src" -o "$obj" || {
        fail "$src: does not compile"; return 1; }
    fi
    objs="$objs${objs:+;}$obj"
  done
}

# expect NAME STATUS VIOLATIONS [LINE...]: the checker on the copy NAME
# exits STATUS, reports VIOLATIONS violations, each LINE among them. The
# copy's library is compiled, unless $keep_objects is set (an include cycle
# or a missing header does not compile: the clean tree's objects are used).
keep_objects=""
expect() {
  name=$1 want_rc=$2 want_n=$3; shift 3
  dir="$tmp/$name"
  if [ -n "$keep_objects" ]; then objs=$clean_objs; else build "$dir" || return; fi
  python3 "$check" --root "$dir" --objects "$objs" > "$dir.out" 2>&1
  rc=$?
  ok=1
  [ "$rc" -eq "$want_rc" ] || { fail "$name: exit $rc, want $want_rc"; ok=0; }
  n=$(sed -n 's/^layers: \([0-9]*\) violation.*/\1/p' "$dir.out")
  [ "$n" = "$want_n" ] || { fail "$name: $n violations, want $want_n"; ok=0; }
  for line in "$@"; do
    grep -Fxq -- "$line" "$dir.out" || { fail "$name: missing: $line"; ok=0; }
  done
  if [ $ok -eq 1 ]; then
    echo "ok: $name"
  else
    sed 's/^/    /' "$dir.out"
  fi
}

copy() { cp -R "$clean" "$tmp/$1"; }
build "$clean" || exit 1
clean_objs=$objs

# The clean tree passes.
copy clean_run
expect clean_run 0 0

# An upward include: gen/ reaches the reference in runtime/ref/.
copy upward_include
echo '#include "runtime/ref/ref.h"' >> "$tmp/upward_include/gen/kir.c"
expect upward_include 1 1 \
  'upward include: gen/kir.c (gen, 3) includes runtime/ref/ref.h (runtime/ref, 4)'

keep_objects=1
# Include cycles: two headers of base/, three of spec/.
copy include_cycle
d="$tmp/include_cycle"
echo '#include "base/names.h"' >> "$d/base/base.h"
put "$d/base/names.h" <<'EOF'
#include "base/base.h"
EOF
put "$d/spec/a.h" <<'EOF'
#include "spec/b.h"
EOF
put "$d/spec/b.h" <<'EOF'
#include "spec/c.h"
EOF
put "$d/spec/c.h" <<'EOF'
#  include "a.h"
EOF
expect include_cycle 1 2 \
  'include cycle: base/base.h -> base/names.h -> base/base.h' \
  'include cycle: spec/a.h -> spec/b.h -> spec/c.h -> spec/a.h'

# An include of a file that does not exist.
copy missing_include
printf '#include "spec/nope.h"\n' >> "$tmp/missing_include/spec/spec.c"
expect missing_include 1 1 \
  'missing include: spec/spec.c:4 includes "spec/nope.h" (no such file beside it, in the repository or in include/)'

keep_objects=""
# An upward call: base/ logs through the context (nothing below calls
# base/log.c, so it closes no cycle).
copy upward_call
put "$tmp/upward_call/base/log.c" <<'EOF'
extern int w16_ctx_log(int x);
int w16_log(int x) { return w16_ctx_log(x); }
EOF
expect upward_call 1 1 \
  'upward call: base/log.c (base, 1) calls runtime/context.c (runtime, 6) (w16_ctx_log)'

# A mutual call between two targets (same rank: only the cycle is wrong).
copy mutual_call
cat >> "$tmp/mutual_call/runtime/cpu/cpu.c" <<'EOF'
extern int w16_ze(int x);
int w16_cpu_ze(int x) { return w16_ze(x); }
EOF
cat >> "$tmp/mutual_call/runtime/ze/ze.c" <<'EOF'
extern int w16_cpu(int x);
int w16_ze_cpu(int x) { return w16_cpu(x); }
EOF
expect mutual_call 1 1 \
  'call cycle: runtime/cpu/cpu.c -> runtime/ze/ze.c -> runtime/cpu/cpu.c (w16_ze; w16_cpu)'

# A call cycle of three files of runtime/ref/, and a generated object that
# calls up (it is rank 0).
copy call_ring
d="$tmp/call_ring"
cat >> "$d/runtime/ref/ref.c" <<'EOF'
extern int w16_io(int x);
int w16_ref_io(int x) { return w16_io(x); }
EOF
put "$d/runtime/ref/io.c" <<'EOF'
extern int w16_codec(int x);
int w16_io(int x) { return w16_codec(x); }
EOF
put "$d/runtime/ref/codec.c" <<'EOF'
extern int w16_ref(int x);
int w16_codec(int x) { return w16_ref(x); }
EOF
cat >> "$d/build/embedded_specs.c" <<'EOF'
extern int w16_ref(int x);
int w16_embedded_get(int x) { return w16_ref(x); }
EOF
expect call_ring 1 2 \
  'call cycle: runtime/ref/codec.c -> runtime/ref/ref.c -> runtime/ref/io.c -> runtime/ref/codec.c (w16_ref; w16_io; w16_codec)' \
  'upward call: embedded_specs.c (generated, 0) calls runtime/ref/ref.c (runtime/ref, 4) (w16_ref)'

# Objects given one per argument work as the ;-separated list does.
# shellcheck disable=SC2086
IFS=';'; set -- $clean_objs; unset IFS
if python3 "$check" --root "$clean" --objects "$@" \
   > "$tmp/args.out" 2>&1 \
   && grep -q '^layers: 0 violations; checked 17 files, 17 includes, 9 objects, 10 call edges$' "$tmp/args.out"
then echo "ok: objects as arguments"
else fail "objects as arguments"; sed 's/^/    /' "$tmp/args.out"; fi

# Usage: --help exits 0; no --root, an unknown option (there is no --allow),
# a missing object or a foreign object path exit 2.
usage() {
  want=$1; shift
  python3 "$check" "$@" > "$tmp/usage.out" 2>&1
  rc=$?
  if [ "$rc" -eq "$want" ]; then echo "ok: usage $* -> $rc"
  else fail "usage $*: exit $rc, want $want"; sed 's/^/    /' "$tmp/usage.out"; fi
}
usage 0 --help
usage 2
usage 2 --root "$tmp/clean_run" --allow "$tmp/none"
usage 2 --root "$tmp/clean_run" --objects "$tmp/none.o"
usage 2 --root "$tmp/none"
cp "$clean/build/CMakeFiles/wna16.dir/base/base.c.o" "$tmp/base.o"
usage 2 --root "$tmp/clean_run" --objects "$tmp/base.o"

if [ "$failures" -ne 0 ]; then
  echo "check_layers_selftest: $failures failure(s)"
  exit 1
fi
echo "check_layers_selftest: all passed"
