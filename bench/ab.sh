#!/usr/bin/env bash
# ab.sh - one bench program, two source trees, in the same run: builds the
# program from both trees (in parallel), then runs A, B, A, B, ... so that
# both see the same machine (clocks, other load, the GPU's temperature),
# and prints each run's output under a [A] / [B] header: a before/after
# counts only when both sides saw the same machine, in one device call.
#
#   bash bench/ab.sh [-n ROUNDS] [-g GREP] [-x TREE]... TREE_A TREE_B TARGET [ARG...]
#
# TREE_A, TREE_B: checkouts (e.g. main and a branch: `git worktree add`, or
# a copy under .gpu/ for the device machine); TARGET: a CMake target under
# bench/ (bench_repack_cuda, bench_moe_cuda, bench_repack, ...), run with
# ARG...; -n: rounds (default 2); -g: keep only output lines matching the
# extended regular expression GREP; -x: one more tree (C, D, ... in the
# order given; variants in one call). Builds are Release, in /tmp/ab-A,
# /tmp/ab-B, ... (kept between calls: a second call rebuilds what changed).
# WNA16_CACHE_DIR is set per tree (/tmp/ab-X/kcache) so that a kernel of
# one tree is never loaded by another.
set -uo pipefail
rounds=2 grep_re= extra=()
while getopts "n:g:x:" o; do
  case $o in
    n) rounds=$OPTARG ;;
    g) grep_re=$OPTARG ;;
    x) extra+=("$OPTARG") ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 3 ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
declare -A tree
tree[A]=$(cd "$1" && pwd) || exit 2
tree[B]=$(cd "$2" && pwd) || exit 2
sides="A B"
letters=(C D E F G H)
for i in "${!extra[@]}"; do
  side=${letters[$i]:?at most ${#letters[@]} trees with -x}
  tree[$side]=$(cd "${extra[$i]}" && pwd) || exit 2
  sides="$sides $side"
done
target=$3
shift 3
gen=; command -v ninja >/dev/null && gen="-G Ninja"
jobs=$(nproc)
for side in $sides; do
  src=${tree[$side]}
  # a build directory configured from another tree is started afresh
  # (CMake refuses a second source directory)
  cache=/tmp/ab-$side/CMakeCache.txt
  if [ -f "$cache" ] &&
     ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$cache"; then
    rm -rf /tmp/ab-$side
  fi
  (
    cmake -S "$src" -B /tmp/ab-$side $gen -DCMAKE_BUILD_TYPE=Release \
      > /tmp/ab-$side.log 2>&1 &&
      cmake --build /tmp/ab-$side -j"$jobs" --target "$target" \
        >> /tmp/ab-$side.log 2>&1
    echo $? > /tmp/ab-$side.rc
  ) &
done
wait
status=0
for side in $sides; do
  if [ "$(cat /tmp/ab-$side.rc 2>/dev/null)" != 0 ]; then
    echo "ab.sh: building $target from tree $side failed (/tmp/ab-$side.log):" >&2
    tail -20 /tmp/ab-$side.log >&2
    status=1
  fi
done
[ $status -eq 0 ] || exit 1
for r in $(seq 1 "$rounds"); do
  for side in $sides; do
    src=${tree[$side]}
    echo "[$side] round $r: $src"
    if [ -n "$grep_re" ]; then
      WNA16_CACHE_DIR=/tmp/ab-$side/kcache /tmp/ab-$side/bench/$target "$@" 2>&1 |
        grep -E "$grep_re"
    else
      WNA16_CACHE_DIR=/tmp/ab-$side/kcache /tmp/ab-$side/bench/$target "$@" 2>&1
    fi
  done
done
