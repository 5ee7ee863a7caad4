# gpu_env.sh - sourced by scripts/gpu_python.sh and scripts/gpu_ep.sh on
# the GPU machine, from the repository root, with $out set: what .gpu/
# carries put in place (the libcjson debs unpacked, pytest's pure-Python
# packages last on PYTHONPATH, the golden files), and the step runner.
# Sets golden, build (absolute; WNA16_GPU_BUILD, default build-gpu),
# summary ($out/summary.txt, emptied) and failed (0); defines
#   step NAME LOG COMMAND...   runs COMMAND into LOG, shows its tail and
#                              records "NAME: exit RC" in the summary; a
#                              status other than 0 and 77 (skipped) sets
#                              failed=1
mkdir -p "$out"
golden=${WNA16_GOLDEN_DIR:-$PWD/.gpu/golden}
[ -d "$golden/gptq_b4_g128" ] || golden=$(cd .. && pwd)/shared/golden
build=${WNA16_GPU_BUILD:-build-gpu}
case $build in /*) ;; *) build=$PWD/$build ;; esac # absolute from here on
if ls .gpu/debs/*.deb > /dev/null 2>&1; then
  for f in .gpu/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
[ -d .gpu/pylib ] && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/.gpu/pylib
# The image's site-packages carry pytest plugins (pytest_timeout) written
# for a newer pytest than the carried 7.2: they fail at registration, and
# the tests need none of them.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
summary=$out/summary.txt
: > "$summary"
failed=0
step() {
  local name=$1 log=$2; shift 2
  echo "== $name: $*"
  "$@" > "$log" 2>&1
  local rc=$?
  tail -n 30 "$log"
  echo "$name: exit $rc" | tee -a "$summary"
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then failed=1; fi
  return 0
}
