#!/usr/bin/env python3
"""The structure of duoserve drawn from the code: the file-level call graph (from the built
objects' defined and undefined symbols, `nm`), its floors, the call circles, the includes that
run back up, and the size limits of the house style.

    make CUDA=0 && python3 scripts/check_structure.py [--build build]

- Call circles: files whose functions call each other in a loop (a strongly connected part of
  the file-level call graph). A family may share one private header; its files must not loop.
- Includes that run back up: file F includes header H of module M (H's own .c, same stem) while
  M's code reaches F's module through calls; and the folder rules of FOLDER_RULES (a lower floor
  that names a higher one). Header include loops count too.
- Size: source files (C, CUDA, headers, and scripts/'s C, Python and shell) over 800 lines, but
  kernel files (CUDA sources with __global__ or __device__ code) and tests; functions over 120
  lines but kernels (__global__ / __device__), from ctags for C and CUDA and the syntax tree for
  Python.

Objects of sources that were not built (the CUDA ones in a CUDA=0 build) are left out of the
call graph, with a note. Exit status: 1 when there is a call circle, an include that runs back
up or a file or function over its size, else 0; 2 when nothing was built."""
import argparse
import ast
import os
import re
import subprocess
import sys

SOURCE_DIRS = ("engine", "server", "cuda")
MAX_FILE_LINES = 800
MAX_FUNC_LINES = 120

# Folder rules: (includer prefix, included prefix, exceptions). A file under the includer prefix
# must not include a header under the included prefix unless it is one of the exceptions.
# engine/text/ is the text floor: it may use the bottom floor's helpers (util.h) and nothing
# else of the engine; the kernels know the backend table, never the engine or the server.
FOLDER_RULES = (
    ("engine/text/", "engine/", ("engine/text/", "engine/util.h")),
    ("engine/", "server/", ()),
    ("cuda/", "server/", ()),
    ("cuda/", "engine/engine.h", ()),
    ("cuda/", "engine/engine_core.h", ()),
    ("cuda/", "engine/text/", ()),
)

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    """Every .c/.h/.cu/.cuh under SOURCE_DIRS, as root-relative paths."""
    out = []
    for d in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in files:
                if f.endswith((".c", ".h", ".cu", ".cuh")):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def scripts(root):
    """scripts/'s C, Python and shell sources, as root-relative paths (sizes only)."""
    d = os.path.join(root, "scripts")
    return sorted(os.path.join("scripts", f) for f in os.listdir(d) if f.endswith((".c", ".h", ".py", ".sh")))


def kernel_file(root, f):
    """A CUDA source with device code: exempt from the file size (kernels are long by nature)."""
    if not f.endswith((".cu", ".cuh")):
        return False
    text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
    return "__global__" in text or "__device__" in text


def python_function_sizes(root, files):
    """(file, function, lines, start) of every Python function."""
    out = []
    for f in files:
        tree = ast.parse(open(os.path.join(root, f), encoding="utf-8").read())
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((f, n.name, n.end_lineno - n.lineno + 1, n.lineno))
    return out


def nm_symbols(obj):
    """(defined global symbols, undefined symbols) of one object file."""
    r = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRGSC":
            # global definitions; weak ones (W, V: C++ inline functions and templates, emitted
            # in every object that uses them) belong to a header, not to a file
            defined.add(name)
    return defined, undefined


def call_graph(root, build, units):
    """File-level graph {unit: {callee unit: [symbols]}} over the units that were built."""
    defs, undefs, missing, stale = {}, {}, [], []
    for u in units:
        obj = os.path.join(build, os.path.splitext(u)[0] + ".o")
        if not os.path.exists(obj):
            missing.append(u)
            continue
        if os.path.getmtime(obj) < os.path.getmtime(os.path.join(root, u)):
            stale.append(u)
        defs[u], undefs[u] = nm_symbols(obj)
    owner = {}
    for u, ds in defs.items():
        for s in ds:
            owner.setdefault(s, []).append(u)
    graph = {u: {} for u in defs}
    for u, us in undefs.items():
        for s in sorted(us):
            for v in owner.get(s, ()):
                if v != u:
                    graph[u].setdefault(v, []).append(s)
    return graph, missing, stale


def sccs(graph):
    """Tarjan's strongly connected components of {node: iterable of successors}."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def floors(graph, comps):
    """Floor of each component: 0 when it calls no other, else 1 + its highest callee's."""
    comp_of = {v: i for i, c in enumerate(comps) for v in c}
    floor = {}

    def f(i):
        if i not in floor:
            floor[i] = 0  # a component's own members are ignored below
            callees = {comp_of[w] for v in comps[i] for w in graph[v]} - {i}
            floor[i] = 1 + max((f(j) for j in callees), default=-1)
        return floor[i]

    return {v: f(comp_of[v]) for v in graph}


def reaches(graph, src):
    seen, todo = {src}, [src]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def includes(root, files):
    """{file: [included project headers]} (paths as written: root-relative, -I.)."""
    out = {}
    for f in files:
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        out[f] = [h for h in INCLUDE_RE.findall(text) if os.path.exists(os.path.join(root, h))]
    return out


def upward_includes(root, graph, incs, circle_of):
    """Includes that run back up: (file, header, why). Includes inside one call circle are left
    to the circle's report."""
    found = []
    reach = {}
    for f, hs in incs.items():
        stem = os.path.splitext(f)[0]
        f_units = [u for u in graph if os.path.splitext(u)[0] == stem]
        for h in hs:
            for pre, bad, allowed in FOLDER_RULES:
                if f.startswith(pre) and h.startswith(bad) and not h.startswith(allowed):
                    found.append((f, h, f"{pre} must not include {bad}"))
            h_stem = os.path.splitext(h)[0]
            if h_stem == stem:
                continue
            for hu in (u for u in graph if os.path.splitext(u)[0] == h_stem):
                if hu not in reach:
                    reach[hu] = reaches(graph, hu)
                for fu in f_units:
                    if fu in reach[hu] and circle_of.get(fu, fu) != circle_of.get(hu, hu):
                        found.append((f, h, f"{hu} calls into {fu}"))
    # header include loops (a.h -> b.h -> a.h)
    hgraph = {f: [h for h in hs if h.endswith((".h", ".cuh"))] for f, hs in incs.items()}
    for comp in sccs(hgraph):
        if len(comp) > 1:
            found.append((comp[0], " ".join(comp[1:]), "headers include each other"))
    return sorted(set(found))


def function_sizes(root, files):
    """(file, function, lines, start) of every function definition ctags finds, or None."""
    try:
        r = subprocess.run(["ctags", "-x", "--kinds-C=f", "--kinds-C++=f", "--fields=+ne",
                            "--langmap=C++:+.cu.cuh", "--_xformat=%N\t%n\t%e\t%F"]
                           + [os.path.join(root, f) for f in files],
                           capture_output=True, text=True)
    except FileNotFoundError:
        return None
    if r.returncode != 0:
        return None
    out = []
    lines_of = {}
    for line in r.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) != 4 or not parts[2].isdigit():
            continue
        name, start, end, path = parts[0], int(parts[1]), int(parts[2]), parts[3]
        rel = os.path.relpath(path, root)
        if rel.endswith((".cu", ".cuh")):
            if rel not in lines_of:
                lines_of[rel] = open(path, encoding="utf-8", errors="replace").read().split("\n")
            head = " ".join(lines_of[rel][max(0, start - 3):start])
            if "__global__" in head or "__device__" in head:
                continue  # kernels are exempt
        out.append((rel, name, end - start + 1, start))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--build", default=None, help="the build folder (default ROOT/build)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every call edge")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    build = os.path.abspath(a.build or os.path.join(root, "build"))
    files = sources(root)
    units = [f for f in files if f.endswith((".c", ".cu"))]
    graph, missing, stale = call_graph(root, build, units)
    if not graph:
        print(f"no objects under {build}: build first (make CUDA=0)")
        return 2
    bad = 0

    print(f"== call graph: {len(graph)} files built, {sum(len(e) for e in graph.values())} "
          f"file-to-file edges")
    if missing:
        print(f"   not built, left out: {' '.join(missing)}")
    if stale:
        print(f"   WARNING objects older than their source (rebuild): {' '.join(stale)}")
    comps = sccs(graph)
    fl = floors(graph, comps)
    n_floors = 1 + max(fl.values())
    print(f"== floors ({n_floors}; a file calls only files on floors below its own)")
    for k in range(n_floors - 1, -1, -1):
        print(f"   {k:2d}: {' '.join(sorted(u for u in graph if fl[u] == k))}")
    if a.verbose:
        for u in sorted(graph):
            for v, syms in sorted(graph[u].items()):
                print(f"   {u} -> {v}: {', '.join(syms)}")

    circles = [c for c in comps if len(c) > 1]
    print(f"== call circles: {len(circles)}")
    for c in circles:
        bad += 1
        print(f"   CIRCLE {' <-> '.join(c)}")
        for u in c:
            for v in c:
                if v in graph[u]:
                    syms = graph[u][v]
                    more = f" (+{len(syms) - 6})" if len(syms) > 6 else ""
                    print(f"      {u} -> {v}: {', '.join(syms[:6])}{more}")

    incs = includes(root, files)
    circle_of = {u: c[0] for c in circles for u in c}
    ups = upward_includes(root, graph, incs, circle_of)
    print(f"== includes that run back up: {len(ups)}")
    for f, h, why in ups:
        bad += 1
        print(f"   UP {f} includes {h} ({why})")

    print(f"== size: files over {MAX_FILE_LINES} lines, functions over {MAX_FUNC_LINES} lines; kernels and "
          f"tests exempt")
    extra = scripts(root)
    checked = [f for f in files + extra if not kernel_file(root, f)]
    for f in checked:
        n = sum(1 for _ in open(os.path.join(root, f), encoding="utf-8", errors="replace"))
        if n > MAX_FILE_LINES:
            bad += 1
            print(f"   FILE {f}: {n} lines")
    funcs = function_sizes(root, files + [f for f in extra if f.endswith((".c", ".h"))])
    if funcs is None:
        print("   (ctags not found or failed: C function sizes not checked)")
        funcs = []
    for f, name, n, start in sorted(funcs + python_function_sizes(root, [f for f in extra if f.endswith(".py")])):
        if n > MAX_FUNC_LINES:
            bad += 1
            print(f"   FUNC {f}:{start} {name}: {n} lines")

    print("== result: " + ("FAIL (circles, upward includes or sizes)" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
