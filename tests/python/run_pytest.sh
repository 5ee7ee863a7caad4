#!/bin/sh
# run_pytest.sh LIBWNA16 INCLUDE_DIR GOLDEN_DIR CACHE_DIR MODULES FILE... -
# runs the pytest files with the wna16 package of this checkout (python/)
# over LIBWNA16 (WNA16_LIBRARY). The interpreter: $WNA16_PYTHON, else the
# first of python3 and /usr/bin/python3 (Debian's, where apt's
# python3-numpy, python3-torch and python3-pytest live) that imports
# pytest and every module of MODULES (comma-separated); none: exit 77
# naming what is missing (scripts/deps.sh installs them). "cuda" in MODULES:
# also exit 77 unless the library finds a CUDA GPU.
set -u
lib=$1 inc=$2 golden=$3 cache=$4 mods=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cuda=
case ",$mods," in *,cuda,*)
  cuda=1
  mods=$(echo ",$mods," | sed 's/,cuda,/,/; s/^,//; s/,$//') ;;
esac
imports="import pytest"
for m in $(echo "$mods" | tr ',' ' '); do imports="$imports, $m"; done
py=
for cand in ${WNA16_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 &&
     "$cand" -c "$imports" >/dev/null 2>&1; then
    py=$cand
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIP: no Python with pytest and $mods (Debian: apt-get install" \
       "python3-pytest python3-numpy python3-torch; scripts/deps.sh)"
  exit 77
fi
mkdir -p "$cache" && chmod 700 "$cache"
export WNA16_LIBRARY="$lib" WNA16_INCLUDE_DIR="$inc" WNA16_GOLDEN_DIR="$golden"
export WNA16_TEST_CACHE="$cache"
export PYTHONPATH="$root/python:$here${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
if [ -n "$cuda" ]; then
  why=$("$py" -c 'import wna16; d = wna16.probe_device()
print("" if d["platform"] == "cuda" else d["notes"])') || exit 1
  if [ -n "$why" ]; then echo "SKIP: no CUDA GPU: $why"; exit 77; fi
fi
cd "$here"
exec "$py" -m pytest -q -p no:cacheprovider "$@"
