#!/bin/sh
# portable_tiling.sh WNA16 SPECS_DIR - the "tiling.portable" table of
# backend specs (spec/spec_tiling.c): the built-in xpu spec's table loads
# and is explained; copies of xpu.json with one defect each are refused by
# `wna16 specs validate`, naming the JSON path and the rule.
wna16=$1
xpu=$2/backends/xpu.json
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
# variant NAME PYTHON-EXPR-ON-t EXPECTED-SUBSTRING
variant() {
    python3 - "$xpu" "$tmp/$1.json" "$2" <<'PY' || exit 1
import json, sys
spec = json.load(open(sys.argv[1]))
spec["name"] = "xpu_variant"
t = spec["tiling"]["portable"]
exec(sys.argv[3])
json.dump(spec, open(sys.argv[2], "w"))
PY
    out=$("$wna16" specs validate "$tmp/$1.json" 2>&1)
    case $out in
    *"$3"*) echo "ok   $1: refused: $3" ;;
    *) echo "FAIL $1: expected '$3', got: $out"; fail=1 ;;
    esac
}
variant rows_3 't[0]["rows"] = 3' '$.tiling.portable[0].rows: expected 1, 2 or 4'
variant workgroup_48 't[1]["workgroup"] = 48' '$.tiling.portable[1].workgroup: expected a power of two'
variant workgroup_512 't[2]["workgroup"] = 512' '$.tiling.portable[2].workgroup: 512 is out of range [16, 256]'
variant last_conditional 't[2]["tokens_per_expert"] = [3, 9]' '$.tiling.portable[2]: the last row must have no condition'
variant middle_unconditional 'del t[0]["tokens_per_expert"]' '$.tiling.portable[0]: only the last row may lack tokens_per_expert'
variant unknown_key 't[0]["subgroup"] = 16' '$.tiling.portable[0]: unknown key "subgroup"'
variant empty 'spec["tiling"]["portable"] = []' '$.tiling.portable: expected an array of 1 to 16 rows'
variant no_table 'del spec["tiling"]["portable"]' '$.tiling: "block_m" and "gemm" are required (the CUDA tables), or "portable"'
variant two_workgroups_differ 't[1]["rows"] = 1; t[1]["workgroup"] = 128' '$.tiling.portable[1].workgroup: rows 1 has workgroup 64 at $.tiling.portable[0]: one workgroup size per value of rows'
out=$("$wna16" specs validate "$xpu" 2>&1) || { echo "FAIL built-in xpu.json: $out"; fail=1; }
echo "$out" | tail -n 1
exit $fail
