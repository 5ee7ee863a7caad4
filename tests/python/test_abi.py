"""test_abi.py - the ctypes mirrors of wna16.h's structs (_lib.py) have the
C compiler's sizes and field offsets: a C program including wna16.h
prints them and every field is compared (test python_api). Skipped
without a C compiler."""
import os
import shutil
import subprocess

import pytest

from wna16 import _lib

# ctypes field name -> C member where they differ
RENAME = {}


def test_struct_layouts(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    inc = os.environ.get("WNA16_INCLUDE_DIR")
    if not cc or not inc:
        pytest.skip("no C compiler or WNA16_INCLUDE_DIR")
    lines = ["#include <stddef.h>", "#include <stdio.h>",
             "#include <wna16.h>", "int main(void) {"]
    for cname, cls in _lib.ABI_STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for f, _ in cls._fields_:
            m = RENAME.get(f, f)
            lines.append(f'printf("{cname}.{f} %zu\\n", '
                         f'offsetof({cname}, {m}));')
    lines += ["return 0; }"]
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run([cc, "-std=c17", f"-I{inc}", str(src), "-o", str(exe)],
                   check=True)
    c = dict(line.split() for line in
             subprocess.run([str(exe)], check=True, capture_output=True,
                            text=True).stdout.splitlines())
    bad = []
    for cname, cls in _lib.ABI_STRUCTS.items():
        if int(c[cname]) != ctypes_sizeof(cls):
            bad.append(f"sizeof {cname}: C {c[cname]}, ctypes "
                       f"{ctypes_sizeof(cls)}")
        for f, _ in cls._fields_:
            off = getattr(cls, f).offset
            if int(c[f"{cname}.{f}"]) != off:
                bad.append(f"{cname}.{f}: C offset {c[cname + '.' + f]}, "
                           f"ctypes {off}")
    assert not bad, "\n".join(bad)


def ctypes_sizeof(cls):
    import ctypes
    return ctypes.sizeof(cls)
