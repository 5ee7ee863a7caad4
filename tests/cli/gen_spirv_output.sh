#!/bin/sh
# wna16 gen --target spirv -o PATH goes through runtime/output.c like every
# output: a regular file replaced atomically, a symbolic link's target
# written and the link kept, - streamed to standard output (the summary
# then goes to stderr), /dev/null streamed to and still a character
# device, a directory given NAME.spv per kernel, no temporary left behind.
# Usage: gen_spirv_output.sh WNA16 SCRATCH_DIR
set -u
W=$1
D=$2
rm -rf "$D" && mkdir -p "$D" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
one="gen --kind moe --to triton --bits 4 --group-size 128 --target spirv --stage input"
all="gen --kind moe --to triton --bits 4 --group-size 128 --target spirv"
magic() { od -An -tx4 -N4 "$1" | tr -d ' \n'; }

"$W" $one -o "$D/one.spv" >"$D/log" 2>&1 || fail "regular file: $(cat "$D/log")"
[ "$(magic "$D/one.spv")" = 07230203 ] || fail "one.spv is not a SPIR-V module"
grep -q "one.spv: .*words" "$D/log" || fail "no summary: $(cat "$D/log")"
# Written again: replaced, the same bytes.
cp "$D/one.spv" "$D/before.spv"
"$W" $one -o "$D/one.spv" >/dev/null 2>&1 || fail "rewrite"
cmp -s "$D/one.spv" "$D/before.spv" || fail "rewrite changed the module"

m=$("$W" $one -o - 2>"$D/err" | od -An -tx4 -N4 | tr -d ' \n')
[ "$m" = 07230203 ] || fail "-o - did not stream the module ($m)"
grep -q "^-: .*words" "$D/err" || fail "-o -: no summary on stderr"

"$W" $one -o /dev/null >/dev/null 2>&1 || fail "/dev/null"
[ -c /dev/null ] || fail "/dev/null is no longer a character device"

ln -s one.spv "$D/link.spv"
rm "$D/one.spv"
"$W" $one -o "$D/link.spv" >/dev/null 2>&1 || fail "link"
[ -L "$D/link.spv" ] || fail "the link was replaced"
[ "$(magic "$D/one.spv")" = 07230203 ] || fail "the link's target not written"

mkdir "$D/dir"
"$W" $all -o "$D/dir" >"$D/log" 2>&1 || fail "directory: $(cat "$D/log")"
n=$(ls "$D/dir" | grep -c '\.spv$')
[ "$n" -ge 4 ] || fail "directory: $n modules"
for f in "$D"/dir/*.spv; do
  [ "$(magic "$f")" = 07230203 ] || fail "$f is not a SPIR-V module"
done
"$W" $all -o "$D/one.spv" >"$D/log" 2>&1 && fail "several kernels into one file"
grep -q "pick one with --tensor or --stage" "$D/log" || fail "$(cat "$D/log")"

left=$(find "$D" -name '*.tmp.*' | wc -l)
[ "$left" -eq 0 ] || fail "$left temporaries left"
echo "gen spirv -o: file, rewrite, -, /dev/null, link, directory ($n modules): ok"
