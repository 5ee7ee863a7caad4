#!/usr/bin/env python3
"""nvrtc_phases.py - where NVRTC spends a translation unit's compile.

Compiles each CUDA C unit given (e.g. `wna16 gen --kind moe --target cuda
... > unit.cu`) cold with NVRTC, with the runtime's options (-arch, C++17,
-default-device, the toolkit's include directory; one thread: no
--split-compile), and prints the median wall time of `--reps` compiles and
NVRTC's own phase table (its --time option) of the median one: front end,
NVVM optimizer, PTX translation (ptxas). Needs libnvrtc, no GPU.

    python3 bench/nvrtc_phases.py [--arch sm_90a] [--reps 3] UNIT.cu...
"""
import argparse
import ctypes
import os
import re
import time


def load():
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise SystemExit("nvrtc_phases: no libnvrtc")


def compile_once(nv, src, opts):
    """(wall seconds, NVRTC log) of one cold compile; exits on failure."""
    prog = ctypes.c_void_p()
    if nv.nvrtcCreateProgram(ctypes.byref(prog), src, b"unit.cu", 0, None,
                             None):
        raise SystemExit("nvrtcCreateProgram failed")
    argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t0 = time.perf_counter()
    rc = nv.nvrtcCompileProgram(prog, len(opts), argv)
    dt = time.perf_counter() - t0
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    text = log.value.decode(errors="replace")
    if rc:
        raise SystemExit("compile failed:\n" + text[:2000])
    return dt, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("units", nargs="+")
    a = ap.parse_args()
    nv = load()
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    opts = ["-arch=" + a.arch, "-std=c++17", "-default-device",
            "--include-path=" + os.path.join(cuda, "include"), "--time=-"]
    compile_once(nv, b"__global__ void k() {}", opts[:2])  # load builtins
    print("%-44s %8s %6s %6s %6s" % ("unit", "ms", "front", "nvvm",
                                      "ptxas"))
    for path in a.units:
        src = open(path, "rb").read()
        runs = sorted(compile_once(nv, src, opts) for _ in range(a.reps))
        dt, log = runs[len(runs) // 2]
        ph = dict((k.strip(), v) for k, v in
                  re.findall(r"unit\.cu, ([^,]+), (\d+), ms", log))
        print("%-44s %8.1f %6s %6s %6s" % (
            os.path.basename(path)[:44], dt * 1e3,
            ph.get("CUDA C++ Frontend", "?"), ph.get("NVVM Optimizer", "?"),
            ph.get("PTX Translation", "?")))


if __name__ == "__main__":
    main()
