#!/bin/sh
# install_test.sh BUILD_DIR WORK CHECKPOINT SOURCE_DIR - the installed
# package used from outside, as a host project would (test host_install):
#   1. cmake --install BUILD_DIR --prefix WORK/prefix, and the files a host
#      needs are there (header, both libraries with the SONAME link, the
#      command, the specs, the CMake package, wna16.pc, the examples);
#   2. the examples project configured out of tree with find_package(wna16)
#      (wna16::wna16 = libwna16.so), built and run on CHECKPOINT; again
#      with wna16_USE_STATIC_LIBS=ON (libwna16.a and its private deps);
#      and on a sharded two-layer copy of CHECKPOINT (shard_checkpoint.py);
#   3. examples/moe_host.c compiled by hand with pkg-config, against the
#      shared library and (--static) the static one, and run; the README's
#      host program compiles;
#   4. the Python package from the install tree finds the installed
#      library by itself and runs examples/moe_host.py (when a Python with
#      numpy is there);
#   5. the installed `wna16` command runs;
#   6. wna16 as a subproject (add_subdirectory, as FetchContent does)
#      configures with wna16::wna16 defined and no test of its own.
set -eu
build=$1 work=$2 ckpt=$3 src=$4
[ -d "$ckpt" ] || { echo "SKIP: no checkpoint $ckpt (WNA16_GOLDEN_DIR)"; exit 77; }
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
p=$work/prefix
cc=${CC:-cc}
run() { echo "+ $*"; "$@"; }

echo "== 1. install"
run cmake --install "$build" --prefix "$p" > "$work/install.log"
for f in include/wna16.h lib/libwna16.a lib/libwna16.so lib/libwna16.so.0 \
         bin/wna16 share/wna16/specs/backends/marlin.json \
         share/wna16/specs/formats/gptq.json \
         lib/cmake/wna16/wna16Config.cmake \
         lib/cmake/wna16/wna16ConfigVersion.cmake lib/pkgconfig/wna16.pc \
         share/wna16/examples/CMakeLists.txt share/wna16/examples/moe_host.c \
         share/wna16/python/wna16/__init__.py; do
  [ -e "$p/$f" ] || { echo "FAIL: $p/$f was not installed"; exit 1; }
done
# move the tree: the package files find the prefix from their own place
mv "$p" "$work/moved"
p=$work/moved

echo "== 2. find_package(wna16)"
for mode in shared static; do
  b=$work/cmake_$mode
  run cmake -S "$p/share/wna16/examples" -B "$b" -DCMAKE_PREFIX_PATH="$p" \
    -Dwna16_USE_STATIC_LIBS=$([ $mode = static ] && echo ON || echo OFF) \
    -DCMAKE_C_COMPILER="$cc" > "$b.log" 2>&1 || { cat "$b.log"; exit 1; }
  run cmake --build "$b" > "$b.build.log" 2>&1 || { cat "$b.build.log"; exit 1; }
  if [ $mode = shared ]; then
    ldd "$b/moe_host" | grep -q "libwna16.so.0 => $p/lib/" ||
      { echo "FAIL: moe_host does not load $p/lib/libwna16.so.0"; ldd "$b/moe_host"; exit 1; }
  elif ldd "$b/moe_host" | grep -q libwna16; then
    echo "FAIL: the static build loads libwna16.so"; exit 1
  fi
  run "$b/moe_host" "$ckpt" --batches 1,5 --repeat 1 --threads 2
done

# the same program on a sharded copy of the checkpoint, two layers deep
# (3 shards + index)
python3 "$src/tests/host/shard_checkpoint.py" "$ckpt" "$work/sharded" 3 2
ls "$work/sharded"/model-00003-of-00003.safetensors > /dev/null
run "$work/cmake_shared/moe_host" "$work/sharded" --batches 2 --repeat 1 \
  --threads 2 | tee "$work/sharded.txt"
grep -q "2 MoE layers" "$work/sharded.txt" &&
  grep -q "^model.layers.1.mlp.experts: repack" "$work/sharded.txt" ||
  { echo "FAIL: the sharded checkpoint's layers were not all run"; exit 1; }

echo "== 3. pkg-config"
export PKG_CONFIG_PATH=$p/lib/pkgconfig
[ "$(pkg-config --modversion wna16)" = "$(grep -o 'WNA16_VERSION_STRING "[^"]*"' "$p/include/wna16.h" | cut -d'"' -f2)" ] ||
  { echo "FAIL: wna16.pc version differs from wna16.h"; exit 1; }
ex=$p/share/wna16/examples/moe_host.c
run $cc -std=c17 -Wall -Wextra -Werror "$ex" $(pkg-config --cflags --libs wna16) \
  -Wl,-rpath,"$p/lib" -o "$work/moe_host_pc"
run "$work/moe_host_pc" "$ckpt" --batches 3 --repeat 1 --threads 2
run $cc -std=c17 -Wall -Wextra -Werror "$ex" $(pkg-config --cflags wna16) \
  "$p/lib/libwna16.a" $(pkg-config --static --libs wna16 | sed 's/-lwna16//') \
  -o "$work/moe_host_pc_static"
if ldd "$work/moe_host_pc_static" | grep -q libwna16; then
  echo "FAIL: the static pkg-config build loads libwna16.so"; exit 1
fi
run "$work/moe_host_pc_static" "$ckpt" --batches 2 --repeat 1 --threads 2

# the README's host program (its ```c block) compiles against the install
python3 - "$src/README.md" "$work/readme.c" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
body = re.search(r"```c\n(.*?)```", text, re.S).group(1)
body = body.replace("#include <wna16.h>\n", "")
open(sys.argv[2], "w").write(
    "#include <wna16.h>\n#include <stdint.h>\nint main(void)\n{\n"
    "    uint16_t hidden[256], out[256];\n    int32_t M = 1;\n"
    "    int32_t topk_ids[2] = {0, 1};\n"
    "    float topk_weights[2] = {0.5f, 0.5f};\n" + body +
    "    return 0;\n}\n")
PY
run $cc -std=c17 -Wall -Wextra -Werror -c "$work/readme.c" \
  $(pkg-config --cflags wna16) -o "$work/readme.o"

echo "== 4. the Python package and example, from the installed tree"
py=
for cand in ${WNA16_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 &&
     "$cand" -c "import numpy" >/dev/null 2>&1; then py=$cand; break; fi
done
if [ -n "$py" ]; then
  # no WNA16_LIBRARY: the package finds <prefix>/lib/libwna16.so.0 itself
  found=$(env -u WNA16_LIBRARY PYTHONPATH="$p/share/wna16/python" "$py" -c \
    'import wna16; print(wna16.library_path)')
  [ "$found" = "$p/lib/libwna16.so.0" ] ||
    { echo "FAIL: the installed package loaded $found"; exit 1; }
  run env -u WNA16_LIBRARY PYTHONPATH="$p/share/wna16/python" "$py" \
    "$p/share/wna16/examples/moe_host.py" "$ckpt" --batches 1,5 --repeat 1 \
    --threads 2
else
  echo "(no Python with numpy: the Python example is not run)"
fi

echo "== 5. the installed command"
run "$p/bin/wna16" specs list > "$work/specs.txt"
grep -q marlin "$work/specs.txt" || { echo "FAIL: wna16 specs list"; exit 1; }

echo "== 6. a subproject"
sp=$work/subproject
mkdir -p "$sp"
cat > "$sp/CMakeLists.txt" <<CML
cmake_minimum_required(VERSION 3.25)
project(host LANGUAGES C)
enable_testing()
add_subdirectory("$src" wna16)
foreach(t wna16::wna16 wna16::shared wna16::static)
  if(NOT TARGET \${t})
    message(FATAL_ERROR "no target \${t}")
  endif()
endforeach()
if(WNA16_BUILD_TESTS OR TARGET host_threads OR TARGET wna16_testutil)
  message(FATAL_ERROR "a subproject built wna16's tests")
endif()
CML
run cmake -S "$sp" -B "$sp/build" -DWNA16_WITH_CUDA=OFF > "$sp.log" 2>&1 ||
  { cat "$sp.log"; exit 1; }
n=$(cd "$sp/build" && ctest -N | sed -n 's/^Total Tests: //p')
[ "$n" = 0 ] || { echo "FAIL: the subproject registered $n tests"; exit 1; }
echo "host_install: all passed"
