#!/usr/bin/env python3
"""Prints each gradient group of the last steps of a harness run, from the daemons' timelines.

A run made with `harness.py --timeline` leaves `timeline-<node>.json` in its run directory
(docs/operations.md §9 names the events). For every group of the last --steps steps under a
merge plan, this prints node 0's times, counted from the step's first gradient ready on node 0
and divided by the dilation (modelled ms): when the group's last tensor was ready (and the latest
of any node), when node 0 received its schedule entry, stage A's span (and the latest end of any
node's stage A: the exchange cannot start before it) and stage B's span.

    .venv/bin/python bench/cluster/timeline_steps.py RUN_DIR/alexnet_pipedream-P8-optimal \\
        --dilation 20 --steps 2
"""

import argparse
import collections
import glob
import json
import os
import re
import sys


def groups_of(path):
    """{seq: {ready, received, a_begin, a_end, b_begin, b_end, elements, step, plan, sparse}}"""
    with open(path) as f:
        events = json.load(f)
    groups = collections.defaultdict(dict)
    for e in events:
        seq = e.get("args", {}).get("seq")
        if e.get("ph") != "X" or seq is None:
            continue
        begin, end = e["ts"], e["ts"] + e["dur"]
        g = groups[seq]
        if e["name"] == "negotiate":  # one per tensor: the group's last tensor decides
            g["ready"] = max(g.get("ready", begin), begin)
            g["received"] = end
        elif e["name"] == "prepare":
            a = e["args"]
            g.update(a_begin=begin, a_end=end, elements=a["elements"], step=a["step"],
                     plan=a["plan"], sparse=a["sparse"])
        elif e["name"] == "exchange":
            g.update(b_begin=begin, b_end=end)
    return {s: g for s, g in groups.items() if "a_begin" in g and "b_begin" in g}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="one run's directory (holding timeline-<node>.json)")
    p.add_argument("--dilation", type=float, default=1.0, help="the run's D (default 1)")
    p.add_argument("--steps", type=int, default=2, help="how many of the last steps (default 2)")
    args = p.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.run_dir, "timeline-*.json")),
                   key=lambda s: int(re.search(r"timeline-(\d+)\.json$", s).group(1)))
    if not paths:
        p.error("no timeline-<node>.json in %s (run the harness with --timeline)" % args.run_dir)
    nodes = [groups_of(path) for path in paths]
    planned = [s for s in sorted(nodes[0]) if nodes[0][s]["plan"] >= 1]
    if not planned:
        p.error("no group under a merge plan in %s" % paths[0])
    steps = sorted({nodes[0][s]["step"] for s in planned})[-args.steps:]
    ms = 1e-3 / args.dilation  # trace microseconds -> modelled ms
    print("times in modelled ms from the step's first gradient ready on node 0; %d node(s)"
          % len(nodes))
    print("%5s %10s %6s | %7s %7s %8s | %15s %8s | %15s"
          % ("seq", "elements", "kind", "ready", "latest", "received", "stage A", "latest",
             "stage B"))
    for step in steps:
        seqs = [s for s in planned if nodes[0][s]["step"] == step]
        base = nodes[0][seqs[0]]["ready"]
        print("step %d" % step)
        for s in seqs:
            g = nodes[0][s]
            everyone = [n[s] for n in nodes if s in n]
            t = lambda x: (x - base) * ms  # noqa: E731
            print("%5d %10d %6s | %7.2f %7.2f %8.2f | %6.2f - %6.2f %8.2f | %6.2f - %6.2f"
                  % (s, g["elements"], "sparse" if g["sparse"] else "dense", t(g["ready"]),
                     t(max(n["ready"] for n in everyone)), t(g["received"]), t(g["a_begin"]),
                     t(g["a_end"]), t(max(n["a_end"] for n in everyone)), t(g["b_begin"]),
                     t(g["b_end"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
