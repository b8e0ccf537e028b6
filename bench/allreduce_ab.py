#!/usr/bin/env python3
"""Alternating rounds of bench/allreduce_loop.py: one or more sparsyncd builds against the same
loop on torch.distributed (gloo), N simulated nodes on this machine, so that drift of a shared
machine hits every side alike. Prints each round and, per size and side, the median time per call
over the rounds and the median of the per-round ratios to torch.distributed.

    .venv/bin/python bench/allreduce_ab.py [--np 4] [--rounds 4] [--seconds 6] \\
        [--elements 1048576,4194304,16777216] [--daemon NAME=PATH ...] [--shim NAME=DIR ...]

Without --daemon or --shim the side is build/daemon/sparsyncd (or SPARSYNC_DAEMON); each --daemon
adds a side run with SPARSYNC_DAEMON=PATH (for example a build of an earlier commit); each --shim
adds a side run of this checkout's daemon whose workers import the Python package from DIR (the
shims/python folder of another checkout), to compare versions of the shim. The load average
before and after is printed.

--sched batch runs every side, its workers and its daemons alike, under the SCHED_BATCH policy
(`chrt -b 0`), whose woken threads do not preempt a running one. With 4 simulated nodes on a
2-core machine, every side's processes otherwise preempt each other at each wake-up, and that
costs either side more than its own hops below 4 MiB (bench/RESULTS.md, issue 14).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from sparsync._paths import find_client_library, find_daemon

HERE = os.path.dirname(os.path.abspath(__file__))
LOOP = os.path.join(HERE, "allreduce_loop.py")


def per_call_ms(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    match = re.search(r"(\d+) calls, ([\d.]+) ms per call", out.stdout)
    if out.returncode != 0 or not match:
        raise SystemExit("failed: %s\n%s%s" % (" ".join(cmd), out.stdout[-2000:],
                                               out.stderr[-2000:]))
    return float(match.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--elements", default="1048576,4194304,16777216")
    ap.add_argument("--daemon", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--shim", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--sched", choices=("normal", "batch"), default="normal",
                    help="the scheduling policy of every side's processes (default: normal)")
    args = ap.parse_args()
    policy = ["chrt", "--batch", "0"] if args.sched == "batch" else []
    sizes = [int(e) for e in args.elements.split(",")]
    daemons = [(name, {"SPARSYNC_DAEMON": os.path.abspath(path)})
               for name, path in (d.split("=", 1) for d in args.daemon)]
    if args.shim:
        # Another checkout's package would look for the daemon and client library in its tree.
        here = {"SPARSYNC_DAEMON": find_daemon(), "SPARSYNC_CLIENT_LIB": find_client_library()}
        daemons += [(name, dict(here, PYTHONPATH=os.path.abspath(path)))
                    for name, path in (d.split("=", 1) for d in args.shim)]
    daemons = daemons or [("sparsync", {})]
    runner = os.path.join(os.path.dirname(sys.executable), "sparsyncrun")
    base_env = dict(os.environ, SPARSYNC_COMPRESSOR="none", SPARSYNC_LOG_LEVEL="warn")
    sides = [name for name, _ in daemons] + ["torch"]
    times = {(side, n): [] for side in sides for n in sizes}
    print("scheduling policy: %s" % args.sched)
    print("load average before %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    for r in range(args.rounds):
        for n in sizes:
            loop_args = ["--elements", str(n), "--seconds", str(args.seconds)]
            for name, side_env in daemons:
                env = dict(base_env, **side_env)
                cmd = policy + [runner, "-np", str(args.np), sys.executable, LOOP] + loop_args
                times[(name, n)].append(per_call_ms(cmd, env))
            cmd = policy + [sys.executable, LOOP, "--torch", str(args.np)] + loop_args
            times[("torch", n)].append(per_call_ms(cmd, base_env))
            print("round %d, %d elements: %s" % (
                r + 1, n, ", ".join("%s %.3f ms" % (s, times[(s, n)][-1]) for s in sides)),
                flush=True)
    print("load average after %.2f %.2f %.2f" % os.getloadavg())
    print()
    print("| float32 elements | bytes |" + "".join(" %s (ms) |" % s for s in sides)
          + "".join(" %s / torch |" % name for name, _ in daemons))
    print("|---:|---:|" + "---:|" * (len(sides) + len(daemons)))
    for n in sizes:
        row = "| %d | %d |" % (n, 4 * n)
        row += "".join(" %.3f |" % statistics.median(times[(s, n)]) for s in sides)
        for name, _ in daemons:
            ratios = [a / b for a, b in zip(times[(name, n)], times[("torch", n)])]
            row += " %.2f |" % statistics.median(ratios)
        print(row)
    print("\n(medians over %d alternating rounds of %.0f s loops; ratios: median of the "
          "per-round ratios)" % (args.rounds, args.seconds))


if __name__ == "__main__":
    main()
