#!/usr/bin/env python3
"""The intake as a PyTorch user sees it: one node, one worker, compressor none, so that a
collective is the hand-over to the daemon and back and nothing else (no other node, no average
to divide). For each size, the median time per call of

  allreduce_   hvd.allreduce_(x): in place; after its first call x lives in the op's shared region
               (docs/intake.md, "Explicit in-place ops"), so a call copies nothing
  allreduce    hvd.allreduce(x): out of place; one copy in, one out (the result is a new tensor)
  memcpy       y.copy_(x) of the same bytes, the bandwidth the intake is held against

and the intake's bandwidth as a fraction of memcpy's (memcpy time / call time: >= 0.9 is the
target of issue 14 "from 16 MiB, as the user sees it").

    .venv/bin/python bench/intake_user.py [--reps 30]

The script starts its own one-node job through sparsyncrun; the load average before and after is
printed.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26]


def timed(fn, reps):
    fn()
    fn()  # the first calls register the tensor and map its region
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker(reps):
    import torch
    import sparsync.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    if hvd.size() != 1:
        raise SystemExit("run with one worker: the intake alone is measured")
    rows = []
    for n in SIZES:
        x = torch.full((n,), 1.5)
        y = torch.empty_like(x)
        in_place = timed(lambda: hvd.allreduce_(x, name=f"in_place.{n}"), reps)
        assert float(x[0]) == 1.5
        out_of_place = timed(lambda: hvd.allreduce(x, name=f"out_of_place.{n}"), reps)
        copy = timed(lambda: y.copy_(x), reps)
        rows.append((4 * n, copy, in_place, out_of_place))
    hvd.shutdown()
    print("| bytes | memcpy (us) | allreduce_ (us) | memcpy / allreduce_ | allreduce (us) "
          "| memcpy / allreduce |")
    print("|---:|---:|---:|---:|---:|---:|")
    for nbytes, copy, in_place, out_of_place in rows:
        print(f"| {nbytes} | {copy * 1e6:.1f} | {in_place * 1e6:.1f} | {copy / in_place:.2f} "
              f"| {out_of_place * 1e6:.1f} | {copy / out_of_place:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.reps)
    runner = os.path.join(os.path.dirname(sys.executable), "sparsyncrun")
    env = dict(os.environ, SPARSYNC_COMPRESSOR="none", SPARSYNC_LOG_LEVEL="warn")
    print("load average before %.2f %.2f %.2f" % os.getloadavg())
    cmd = [runner, "-np", "1", sys.executable, os.path.abspath(__file__), "--worker",
           "--reps", str(args.reps)]
    rc = subprocess.run(cmd, env=env).returncode
    print("load average after %.2f %.2f %.2f" % os.getloadavg())
    return rc


if __name__ == "__main__":
    sys.exit(main())
