#!/usr/bin/env python3
"""check_exports.py - what libwna16.so exports (CTest test host_exports).

Checks, with nm and readelf (binutils):
  - the SONAME is libwna16.so.<WNA16_VERSION_MAJOR of include/wna16.h>;
  - every defined dynamic symbol is public API: its name starts with
    wna16_ (no w16_/kir_ internals, no SPIRV-Tools or C++ runtime symbols);
  - every function include/wna16.h declares is exported (a declaration
    without a definition, or one the version script hides, fails);
  - libwna16.a defines the same wna16_* functions (both flavours are one
    set of objects).
Usage: check_exports.py LIBWNA16_SO LIBWNA16_A WNA16_H
"""
import re
import subprocess
import sys


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True,
                          text=True).stdout


def header_functions(path):
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"^\s*#.*?(?<!\\)$", " ", text, flags=re.M | re.S)
    names = set()
    for m in re.finditer(r"(\(\s*\*\s*)?\b(wna16_[A-Za-z0-9_]+)\s*\(", text):
        if m.group(1):  # a function pointer type, (*wna16_log_fn)(...)
            continue
        names.add(m.group(2))
    return names


def main():
    so, ar, header = sys.argv[1:4]
    failures = []
    major = re.search(r"#define WNA16_VERSION_MAJOR (\d+)",
                      open(header).read()).group(1)
    dyn = run("readelf", "-d", so)
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", dyn)
    want = f"libwna16.so.{major}"
    if not m or m.group(1) != want:
        failures.append(f"SONAME is {m.group(1) if m else 'missing'}, "
                        f"expected {want}")
    exported = set()
    for line in run("nm", "-D", "--defined-only", so).splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        kind, name = parts[1], parts[2].split("@")[0]
        if kind in ("A",):  # version nodes
            continue
        if not name.startswith("wna16_"):
            failures.append(f"exported symbol outside the API: {name} ({kind})")
        exported.add(name)
    declared = header_functions(header)
    for name in sorted(declared - exported):
        failures.append(f"declared in wna16.h but not exported: {name}")
    static = set()
    for line in run("nm", "--defined-only", ar).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDRB" and \
                parts[2].startswith("wna16_"):
            static.add(parts[2])
    for name in sorted(exported - static):
        failures.append(f"exported by {so} but not defined by {ar}: {name}")
    for name in sorted(declared - static):
        failures.append(f"declared in wna16.h but not in {ar}: {name}")
    for f in failures:
        print("FAIL:", f)
    print(f"{so}: SONAME {m.group(1) if m else '?'}, {len(exported)} symbols "
          f"exported, {len(declared)} functions declared in wna16.h")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
