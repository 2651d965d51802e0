#!/usr/bin/env python3
"""ktrace_report: where the GPU time of each CUDA graph goes, from a scripts/ktrace.c trace.

    python3 scripts/ktrace_report.py trace.txt [--min-launches 5] [--top 25]

Kernels are grouped into graph launches (consecutive kernels of one graph id). For each graph
replayed at least --min-launches times: the mean wall time of a launch (first kernel start to
last kernel end), the kernels' busy time and the idle gaps between them; then, per kernel
(name and grid), how many run a launch, their mean time, the mean gap before each and the
critical-path time it adds ("crit": its end minus the latest end before it, so a kernel that
starts early under programmatic launch is charged only for what it extends the launch by;
the crit column sums to the launch's wall time).
Standard library only; names are demangled with c++filt when it is installed."""
import argparse
import collections
import shutil
import subprocess


def demangle(names):
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out))


def short(name, width=70):
    # drop the argument list, keep the template arguments (they name the kernel variant)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut].replace("__nv_bfloat16", "bf16").replace("(unsigned char)", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--min-launches", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    recs = []
    with open(args.trace) as f:
        for line in f:
            p = line.split(" ", 5)
            if len(p) == 6:
                recs.append((int(p[0]), int(p[1]), int(p[2]), p[3], int(p[4]), p[5].strip()))
    recs.sort()
    names = demangle(sorted({r[5] for r in recs}))
    launches = []  # (graph id, [records])
    # a launch goes on while the graph id stays and the kernels follow within 200 us, until its
    # first kernel (name and grid) comes again: back-to-back replays of one graph are apart
    for r in recs:
        if (r[2] and launches and launches[-1][0] == r[2] and r[0] - launches[-1][1][-1][1] < 200_000
                and (r[5], r[3]) != (launches[-1][1][0][5], launches[-1][1][0][3])):
            launches[-1][1].append(r)
        elif r[2]:
            launches.append((r[2], [r]))
    by_graph = collections.defaultdict(list)
    for gid, ks in launches:
        by_graph[(gid, len(ks))].append(ks)
    for (gid, nk), group in sorted(by_graph.items(), key=lambda kv: -len(kv[1])):
        if len(group) < args.min_launches:
            continue
        group = group[1:] or group  # the first replay warms caches and clocks
        n = len(group)
        wall = sum(ks[-1][1] - ks[0][0] for ks in group) / n / 1e3
        busy = sum(sum(k[1] - k[0] for k in ks) for ks in group) / n / 1e3
        print(f"graph {gid}: {nk} kernels, {n} launches: {wall:.1f} us a launch, kernels busy {busy:.1f} us, "
              f"gaps {wall - busy:.1f} us ({(wall - busy) / max(nk - 1, 1) * 1e3:.0f} ns a kernel boundary)")
        stat = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # count, time, gap before, crit
        for ks in group:
            last_end = ks[0][0]
            for i, k in enumerate(ks):
                s = stat[(names.get(k[5], k[5]), k[3], k[4])]
                s[0] += 1
                s[1] += (k[1] - k[0]) / 1e3
                s[2] += (k[0] - ks[i - 1][1]) / 1e3 if i else 0.0
                s[3] += max(0, k[1] - last_end) / 1e3
                last_end = max(last_end, k[1])
        rows = sorted(stat.items(), key=lambda kv: -kv[1][1])
        print(f"  {'kernel':70} {'grid':>12} {'blk':>4} {'/launch':>7} {'us each':>8} {'gap us':>7} {'us/launch':>9} {'crit us':>7} {'crit/launch':>11}")
        for (name, grid, blk), (c, t, gap, crit) in rows[: args.top]:
            print(f"  {short(name):70} {grid:>12} {blk:>4} {c / n:7.1f} {t / c:8.2f} {gap / c:7.2f} {t / n:9.1f} "
                  f"{crit / c:7.2f} {crit / n:11.1f}")
        print()


if __name__ == "__main__":
    main()
