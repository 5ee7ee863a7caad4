#!/usr/bin/env python3
"""Checks that wna16's folders read as the pipeline, one way.

Each source file has a rank given by its folder (the table LAYERS below). A
file may include headers of, and call into, files of its own rank or lower,
never higher; and no files may form a cycle, of includes (followed through
headers) or of calls (read from the link map of the library's objects with
`nm`). There are no exceptions: a violation is fixed in the code, not listed
here.

usage: check_layers.py --root DIR [--objects OBJ...] [--nm NM]

  --root DIR      the repository (holds base/, spec/, gen/, runtime/, tools/)
  --objects OBJ   the library's object files, as paths or as one ;-separated
                  list (what CMake's $<TARGET_OBJECTS:wna16> gives). A
                  source's object is .../CMakeFiles/<target>.dir/<source>.o;
                  an object whose source is not under a ranked folder (a
                  generated file such as embedded_specs.c.o) has rank 0:
                  anyone may use it. Without --objects only includes are
                  checked.
  --nm NM         the nm to run (default: $NM, else nm)

Prints one line per violation, then a summary; exits 0 when the layering
holds, 1 on a violation, 2 on a usage error (or when nm cannot be run).
"""

import argparse
import os
import re
import subprocess
import sys

# ---- the layers -------------------------------------------------------------
# (folder prefix, rank, what it holds). The first row whose prefix starts a
# file's repository-relative path gives its rank; "runtime/*/" is any
# subfolder of runtime/ not named above it (a target). The comment above each
# row says why it sits there.
LAYERS = [
    # The public API: types and declarations only; everyone may see it.
    ("include/", 0, "the public header (wna16.h)"),
    # Needed by all, needs nothing of ours.
    ("base/", 1, "status, arena, logging, hashing and keys, names, tensors"),
    # Reads the specs with base/ only; gen/ and the runtime consume it.
    ("spec/", 2, "expressions, spec loading, registry, layouts, checks"),
    # Turns loaded specs into kernel text; it runs nothing, so it needs
    # nothing of runtime/. (templates/ is CUDA text gen/ embeds: not ranked.)
    ("gen/", 3, "kernel IR, builders, emitters, template specialization"),
    # The reference and the kernel cache are used by the targets (to check
    # and fall back, to store and load binaries), so they sit below them.
    ("runtime/ref/", 4, "the reference"),
    ("runtime/cache/", 4, "the kernel cache"),
    # What a target is (the descriptor every target fills in) and the
    # kernel-through-the-cache helper every target shares: below the
    # targets that implement it, beside the cache it uses.
    ("runtime/target/", 4, "the target descriptor"),
    # One folder per target (cpu/, cuda/, later ze/): they use ref/ and
    # cache/ and are used by the runtime's top files.
    ("runtime/*/", 5, "a target (cpu/, cuda/, ze/...)"),
    # The runtime's top files orchestrate the targets (selection,
    # checkpoints, repack, MoE); context.c sits at the top of the library.
    ("runtime/", 6, "selection, checkpoints, repack, MoE, the context"),
    # The command line uses everything and is used by none.
    ("tools/", 7, "the wna16 command line"),
]

# The folders whose .c and .h files are checked for includes (tests/, bench/
# and examples/ are leaves, generated files live in the build tree).
CHECKED_FOLDERS = ["include", "base", "spec", "gen", "runtime", "tools"]


def layer_of(path):
    """(rank, layer name) of a repository-relative path, or None."""
    parts = path.split("/")
    for prefix, rank, _what in LAYERS:
        pre = prefix.rstrip("/").split("/")
        if len(parts) <= len(pre):
            continue  # a layer holds files below its folder
        if all(p == "*" or p == q for p, q in zip(pre, parts)):
            name = "/".join(parts[:len(pre)])
            return rank, name
    return None


def describe(path, layer):
    return "%s (%s, %d)" % (path, layer[1], layer[0])


# ---- includes ---------------------------------------------------------------
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">]+)[">]',
                        re.M)


def strip_comments(text):
    """The text with comments replaced by spaces (newlines kept), leaving
    string and character literals alone."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def source_files(root):
    files = []
    for folder in CHECKED_FOLDERS:
        top = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith((".c", ".h")):
                    full = os.path.join(dirpath, f)
                    files.append(os.path.relpath(full, root).replace(os.sep,
                                                                     "/"))
    return files


def resolve(root, includer, name, quoted):
    """The repository-relative path an include names, as the compiler finds
    it: a quoted name first beside the includer, then (quoted or not) under
    the repository root and include/. None when not found."""
    bases = [os.path.dirname(includer)] if quoted else []
    bases += ["", "include"]
    for b in bases:
        rel = os.path.normpath(os.path.join(b, name)).replace(os.sep, "/")
        if rel.startswith("../") or rel == "..":
            continue
        if os.path.isfile(os.path.join(root, rel)):
            return rel
    return None


def read_includes(root, files):
    """{file: [(line, name, resolved path or None)]}; quoted includes that
    are not found are kept (as None), angle ones are system headers."""
    edges = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8",
                  errors="replace") as fh:
            text = strip_comments(fh.read())
        found = []
        for m in INCLUDE_RE.finditer(text):
            quoted = m.group(1) == '"'
            name = m.group(2).strip()
            line = text.count("\n", 0, m.start()) + 1
            target = resolve(root, f, name, quoted)
            if target is None and not quoted:
                continue
            found.append((line, name, target))
        edges[f] = found
    return edges


# ---- graphs -----------------------------------------------------------------
def strongly_connected(nodes, succ):
    """Tarjan's strongly connected components (iterative), each sorted."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(succ.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


def shortest_cycle(node, succ, within):
    """The shortest cycle node -> ... -> node inside the set `within`."""
    prev = {node: None}
    queue = [node]
    for v in queue:
        for w in sorted(succ.get(v, ())):
            if w == node:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [node]
            if w in within and w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def cycles(nodes, succ):
    """Cycles to report: for every file on a cycle (a strongly connected
    component of two or more files, or a file that reaches itself), the
    shortest cycle through it; each cycle once, starting at its least file."""
    seen, out = set(), []
    for comp in strongly_connected(nodes, succ):
        if len(comp) == 1 and comp[0] not in succ.get(comp[0], ()):
            continue
        within = set(comp)
        for v in comp:
            cyc = shortest_cycle(v, succ, within)
            if cyc is None:
                continue
            ring = cyc[:-1]
            k = ring.index(min(ring))
            ring = ring[k:] + ring[:k]
            if tuple(ring) not in seen:
                seen.add(tuple(ring))
                out.append(ring + [ring[0]])
    return out


# ---- the link map -------------------------------------------------------------
OBJ_RE = re.compile(r"(?:^|/)CMakeFiles/[^/]+\.dir/(.+?)\.(?:o|obj)$")


def object_source(root, obj):
    """The repository-relative source path of an object, or None."""
    p = os.path.abspath(obj).replace(os.sep, "/")
    m = OBJ_RE.search(p)
    if m:
        return m.group(1)
    r = os.path.abspath(root).replace(os.sep, "/") + "/"
    if p.startswith(r) and re.search(r"\.(o|obj)$", p):
        return re.sub(r"\.(o|obj)$", "", p[len(r):])
    return None


def nm_symbols(nm, objects):
    """{object: (defined globals, undefined references)}, from one `nm -A`
    run per batch of objects (each line starts with its object's path)."""
    out = {o: (set(), set()) for o in objects}
    for i in range(0, len(objects), 64):
        batch = objects[i:i + 64]
        res = subprocess.run([nm, "-g", "-P", "-A"] + batch,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
        if res.returncode != 0:
            raise RuntimeError("%s: %s" % (nm, res.stderr.strip()))
        by_length = sorted(batch, key=len, reverse=True)
        for line in res.stdout.splitlines():
            obj = next((o for o in by_length if line.startswith(o + ": ")),
                       None)
            if obj is None:
                continue
            parts = line[len(obj) + 2:].split()
            if len(parts) < 2:
                continue
            name, kind = parts[0], parts[1]
            defined, undefined = out[obj]
            if kind in ("U", "w", "v"):
                undefined.add(name)
            elif kind.isupper() or kind in ("i", "u"):
                defined.add(name)
    return out


# ---- the check --------------------------------------------------------------
def check_includes(root, report):
    files = source_files(root)
    includes = read_includes(root, files)
    succ, n_edges = {}, 0
    for f in files:
        lf = layer_of(f)
        for line, name, target in includes[f]:
            n_edges += 1
            if target is None:
                report("missing include: %s:%d includes \"%s\" (no such "
                       "file beside it, in the repository or in include/)"
                       % (f, line, name))
                continue
            succ.setdefault(f, set()).add(target)
            lt = layer_of(target)
            if lt is None:
                report("include outside the layers: %s includes %s (not in "
                       "a ranked folder)" % (describe(f, lf), target))
            elif lt[0] > lf[0]:
                report("upward include: %s includes %s"
                       % (describe(f, lf), describe(target, lt)))
    for cyc in cycles(files, succ):
        report("include cycle: %s" % " -> ".join(cyc))
    return len(files), n_edges


def check_calls(root, objects, nm, report):
    sources, defs, refs = [], {}, {}
    for obj in objects:
        if object_source(root, obj) is None:
            raise ValueError("%s: not a CMake object (.../CMakeFiles/"
                             "<target>.dir/<source>.o) nor under --root"
                             % obj)
    symbols = nm_symbols(nm, objects)
    for obj in objects:
        src = object_source(root, obj)
        d, u = symbols[obj]
        sources.append(src)
        refs[src] = u
        for s in d:
            defs.setdefault(s, set()).add(src)
    layers = {s: layer_of(s) or (0, "generated") for s in sources}
    edge_syms = {}
    for src in sources:
        for s in refs[src]:
            for owner in defs.get(s, ()):  # symbols not ours are skipped
                if owner != src:
                    edge_syms.setdefault((src, owner), set()).add(s)
    succ = {}
    for (a, b), syms in sorted(edge_syms.items()):
        succ.setdefault(a, set()).add(b)
        if layers[b][0] > layers[a][0]:
            report("upward call: %s calls %s (%s)"
                   % (describe(a, layers[a]), describe(b, layers[b]),
                      ", ".join(sorted(syms))))
    for cyc in cycles(sorted(set(sources)), succ):
        syms = "; ".join(", ".join(sorted(edge_syms[(a, b)]))
                         for a, b in zip(cyc, cyc[1:]))
        report("call cycle: %s (%s)" % (" -> ".join(cyc), syms))
    return len(set(sources)), len(edge_syms)


def main(argv):
    ranks = "\n".join("  %d  %-15s %s" % (r, p, what)
                      for p, r, what in LAYERS)
    ap = argparse.ArgumentParser(
        prog="check_layers.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Checks that wna16's folders depend one way: no file "
                    "includes a header of,\nor calls into, a file of a "
                    "higher rank; no include or call cycle; no include\nof "
                    "a missing file. The ranks, lowest first:\n" + ranks,
        epilog="Exit status: 0 the layering holds, 1 a violation, 2 a usage "
               "error.\nThere are no exceptions to list.")
    ap.add_argument("--root", required=True,
                    help="the repository root")
    ap.add_argument("--objects", nargs="+", default=[], metavar="OBJ",
                    help="the library's object files, as paths or ;-separated "
                         "lists ($<TARGET_OBJECTS:wna16>)")
    ap.add_argument("--nm", default=os.environ.get("NM") or "nm",
                    help="the nm to run (default: $NM, else nm)")
    args = ap.parse_args(argv)

    root = args.root
    if not all(os.path.isdir(os.path.join(root, d))
               for d in ("base", "spec", "gen", "runtime")):
        ap.error("%s: not the repository (no base/, spec/, gen/, runtime/)"
                 % root)
    objects = [o for arg in args.objects for o in arg.split(";") if o]
    for o in objects:
        if not os.path.isfile(o):
            ap.error("%s: no such object file" % o)

    violations = []

    def report(line):
        violations.append(line)
        print(line)

    n_files, n_includes = check_includes(root, report)
    n_objects = n_calls = 0
    if objects:
        try:
            n_objects, n_calls = check_calls(root, objects, args.nm, report)
        except (OSError, RuntimeError, ValueError) as e:
            print("check_layers.py: %s" % e, file=sys.stderr)
            return 2
    print("layers: %d violation%s; checked %d files, %d includes, %d "
          "objects, %d call edges%s"
          % (len(violations), "" if len(violations) == 1 else "s",
             n_files, n_includes, n_objects, n_calls,
             "" if objects else " (no --objects: calls not checked)"))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
