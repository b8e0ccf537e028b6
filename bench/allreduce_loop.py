#!/usr/bin/env python3
"""A steady loop of one in-place dense allreduce, for profiling the daemons (perf, per-thread CPU)
and for A/B runs of two daemon builds (SPARSYNC_DAEMON):

    SPARSYNC_COMPRESSOR=none .venv/bin/sparsyncrun -np 4 .venv/bin/python bench/allreduce_loop.py \
        [--elements 16777216] [--seconds 15]

Rank 0 prints the mean time per call over the loop (after 3 warm-up calls). Every rank makes
the same number of calls: rank 0's estimate of how many fit in --seconds, agreed on with one
allreduce first (a loop that each rank ended on its own clock left one rank in a call the others
never made).
"""
import argparse
import time

import torch

import sparsync.torch as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 24, help="float32 elements")
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    x = torch.full((args.elements,), float(hvd.rank() + 1))
    warm_start = time.perf_counter()
    for _ in range(3):
        hvd.allreduce_(x, name="loop")
        x.fill_(1.0)
    per_call = (time.perf_counter() - warm_start) / 3
    planned = torch.tensor([float(max(1, int(args.seconds / per_call)))])
    calls = int(hvd.allreduce(planned, name="loop.calls", op=hvd.Max).item())
    start = time.perf_counter()
    for _ in range(calls):
        hvd.allreduce_(x, name="loop")
        x.fill_(1.0)
    if hvd.rank() == 0:
        print("%d calls, %.3f ms per call" % (calls, 1000 * (time.perf_counter() - start) / calls))
    hvd.shutdown()


if __name__ == "__main__":
    main()
