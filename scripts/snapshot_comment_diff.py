#!/usr/bin/env python3
"""Check that two gen_snapshot recordings differ in comment lines only.

usage: snapshot_comment_diff.py BEFORE_DIR AFTER_DIR (two `gen_snapshot.sh record` folders)
For every case whose MANIFEST line (sha, exit status) differs, diff
BEFORE/CASE.txt against AFTER/CASE.txt; every removed or added line must be
a comment in its own file: a // line, a line inside (or opening/closing) a
/* */ block, a ';' comment of LLVM IR, or a JSON-style "description"/"note"
string. Prints one line per changed case and a summary; exit 1 otherwise.
"""
import difflib, re, sys

def manifest(d):
    m = {}
    for line in open(f"{d}/MANIFEST"):
        sha, rc, case = line.split()
        m[case] = (sha, rc)
    return m

def classify(lines):
    """For each line: True when the whole line is comment text."""
    out, in_block = [], False
    for l in lines:
        s = l.strip()
        if in_block:
            out.append(True)
            if '*/' in s:
                # the block must end the line's code too
                in_block = False
                if s.split('*/', 1)[1].strip():
                    out[-1] = False
            continue
        if s.startswith('//') or s.startswith(';'):
            out.append(True)
        elif s.startswith('/*'):
            rest = s[2:]
            if '*/' in rest:
                out.append(not rest.split('*/', 1)[1].strip())
            else:
                in_block = True
                out.append(True)
        elif re.match(r'^"(description|note)"\s*:', s):
            out.append(True)
        else:
            out.append(False)
    return out

def main(before, after):
    mb, ma = manifest(before), manifest(after)
    if set(mb) != set(ma):
        print("case lists differ:", sorted(set(mb) ^ set(ma)))
        return 1
    changed = sorted(c for c in mb if mb[c] != ma[c])
    bad = 0
    n_lines = 0
    for case in changed:
        bad0 = bad
        a = open(f"{before}/{case}.txt").read().splitlines()
        b = open(f"{after}/{case}.txt").read().splitlines()
        ca, cb = classify(a), classify(b)
        if mb[case][1] != ma[case][1]:
            print(f"{case}: exit status {mb[case][1]} -> {ma[case][1]}")
            bad += 1
        sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
        rem = add = 0
        for op, i1, i2, j1, j2 in sm.get_opcodes():
            if op == 'equal':
                continue
            for i in range(i1, i2):
                rem += 1
                if not ca[i]:
                    print(f"{case}: removed non-comment line {i+1}: {a[i]}")
                    bad += 1
            for j in range(j1, j2):
                add += 1
                if not cb[j]:
                    print(f"{case}: added non-comment line {j+1}: {b[j]}")
                    bad += 1
        n_lines += rem + add
        print(f"{case}: -{rem} +{add} lines, "
              f"{'all comments' if bad == bad0 else 'NOT all comments'}")
    print(f"{len(changed)} of {len(mb)} cases differ; {n_lines} changed lines; "
          f"{'all comment lines' if not bad else f'{bad} NON-COMMENT differences'}")
    return 1 if bad else 0

if __name__ == '__main__':
    sys.exit(main(sys.argv[1], sys.argv[2]))
