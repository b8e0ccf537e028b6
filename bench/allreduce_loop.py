#!/usr/bin/env python3
"""A steady loop of one in-place dense allreduce, for profiling the daemons (perf, per-thread CPU)
and for A/B runs of two daemon builds (SPARSYNC_DAEMON), with the same loop on torch.distributed
as the baseline:

    SPARSYNC_COMPRESSOR=none .venv/bin/sparsyncrun -np 4 .venv/bin/python bench/allreduce_loop.py \
        [--elements 16777216] [--seconds 15]
    .venv/bin/python bench/allreduce_loop.py --torch 4 [--elements ...] [--seconds ...]

Each call is `allreduce_(x)` (torch: `all_reduce(x); x.div_(size)`), then `x.fill_(1.0)`. Rank 0
prints the mean time per call over the loop (after 3 warm-up calls). Every rank makes the same
number of calls: rank 0's estimate of how many fit in --seconds, agreed on with one allreduce
first (a loop that each rank ended on its own clock left one rank in a call the others never
made). `--torch N` starts N processes on loopback with torch.distributed's gloo backend.
"""
import argparse
import os
import socket
import time

import torch


def sparsync_side():
    import sparsync.torch as hvd
    hvd.init()

    def allreduce(x, name):
        hvd.allreduce_(x, name=name)

    def agree_max(value):
        return hvd.allreduce(torch.tensor([value]), name="loop.calls", op=hvd.Max).item()
    return hvd.rank(), allreduce, agree_max, hvd.shutdown


def torch_side(rank, size):
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=size)

    def allreduce(x, name):
        dist.all_reduce(x)
        x.div_(size)

    def agree_max(value):
        t = torch.tensor([value])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()
    return rank, allreduce, agree_max, dist.destroy_process_group


def loop(side, args):
    torch.set_num_threads(1)
    rank, allreduce, agree_max, finish = side
    x = torch.full((args.elements,), float(rank + 1))
    warm_start = time.perf_counter()
    for _ in range(3):
        allreduce(x, "loop")
        x.fill_(1.0)
    per_call = (time.perf_counter() - warm_start) / 3
    calls = int(agree_max(float(max(1, int(args.seconds / per_call)))))
    start = time.perf_counter()
    for _ in range(calls):
        allreduce(x, "loop")
        x.fill_(1.0)
    if rank == 0:
        print("%d calls, %.3f ms per call" % (calls, 1000 * (time.perf_counter() - start) / calls),
              flush=True)
    finish()


def torch_rank(rank, size, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    loop(torch_side(rank, size), args)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=1 << 24, help="float32 elements")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--torch", type=int, metavar="N",
                    help="the baseline: N torch.distributed (gloo) processes instead")
    args = ap.parse_args()
    if args.torch is None:
        return loop(sparsync_side(), args)
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(torch_rank, args=(args.torch, port, args), nprocs=args.torch)


if __name__ == "__main__":
    main()
