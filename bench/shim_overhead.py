#!/usr/bin/env python3
"""The PyTorch shim's own time per collective: a one-node, one-worker job (compressor none) makes
`hvd.allreduce_(x, name=...)` calls on a small tensor, and the time each call spends in
`Client.post` and `Client.wait` (the hand-over to the daemon and its answer) is taken out of the
call's time. What is left is the Python around the call: registration lookup, the region views,
the landing of the result, the handle bookkeeping.

    .venv/bin/python bench/shim_overhead.py [--elements 1024] [--calls 3000] [--rounds 3] \\
        [--shim NAME=DIR ...]

Each --shim adds a side whose worker imports the package from DIR (the shims/python folder of
another checkout); sides alternate round by round. Without --shim, this checkout's package.
Prints per round and side: the call, post + wait, and the rest (the shim's own part), in us
(medians over the rounds at the end); the load average before and after.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(elements, calls):
    import torch
    import sparsync.torch as hvd
    from sparsync import _client
    torch.set_num_threads(1)
    hvd.init()
    spent = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
        return wrapper
    _client.Client.post = timed(_client.Client.post)
    _client.Client.wait = timed(_client.Client.wait)
    x = torch.full((elements,), 1.5)
    for _ in range(50):
        hvd.allreduce_(x, name="overhead")
    spent[0] = 0.0
    start = time.perf_counter()
    for _ in range(calls):
        hvd.allreduce_(x, name="overhead")
    total = (time.perf_counter() - start) / calls
    daemon = spent[0] / calls
    print("RESULT %.1f %.1f %.1f" % (1e6 * total, 1e6 * daemon, 1e6 * (total - daemon)),
          flush=True)
    hvd.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=1024, help="float32 elements")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shim", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.elements, args.calls)
    from sparsync._paths import find_client_library, find_daemon
    here = {"SPARSYNC_DAEMON": find_daemon(), "SPARSYNC_CLIENT_LIB": find_client_library(),
            "SPARSYNC_COMPRESSOR": "none", "SPARSYNC_LOG_LEVEL": "warn"}
    sides = [(name, dict(here, PYTHONPATH=os.path.abspath(path)))
             for name, path in (s.split("=", 1) for s in args.shim)] or [("sparsync", here)]
    runner = os.path.join(os.path.dirname(sys.executable), "sparsyncrun")
    results = {name: [] for name, _ in sides}
    print("load average before %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    for r in range(args.rounds):
        for name, side_env in sides:
            cmd = [runner, "-np", "1", sys.executable, os.path.abspath(__file__), "--worker",
                   "--elements", str(args.elements), "--calls", str(args.calls)]
            out = subprocess.run(cmd, env=dict(os.environ, **side_env), capture_output=True,
                                 text=True, timeout=600)
            line = [ln for ln in out.stdout.splitlines() if "RESULT" in ln]
            if out.returncode != 0 or not line:
                raise SystemExit("failed: %s\n%s%s" % (" ".join(cmd), out.stdout[-2000:],
                                                       out.stderr[-2000:]))
            row = [float(v) for v in line[0].split("RESULT")[1].split()]
            results[name].append(row)
            print("round %d, %s: call %.1f us, post + wait %.1f us, shim %.1f us"
                  % (r + 1, name, *row), flush=True)
    print("load average after %.2f %.2f %.2f" % os.getloadavg())
    print()
    print("| side | call (us) | post + wait (us) | the shim's own part (us) |")
    print("|---|---:|---:|---:|")
    for name, rows in results.items():
        print("| %s | %s |" % (name, " | ".join("%.1f" % statistics.median(col)
                                                for col in zip(*rows))))
    print("\n(%d rounds of %d calls of %d float32 elements, sides alternating; medians)"
          % (args.rounds, args.calls, args.elements))


if __name__ == "__main__":
    main()
