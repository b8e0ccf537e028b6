"""A script that launches itself, as Horovod's examples do with horovod.run.

Prints the results of sparsync.run(train, ...) in rank order; with "fail" the function raises
on rank 1 and the script prints the RunError."""

import sys

import sparsync as horovod


def train(offset, fail):
    import torch

    import sparsync.torch as hvd

    hvd.init()
    if fail and hvd.rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    return {"rank": hvd.rank(), "size": hvd.size(), "value": total + offset}


if __name__ == "__main__":
    try:
        fail = len(sys.argv) > 1 and sys.argv[1] == "fail"
        print("RESULTS", horovod.run(train, args=(100, fail), np=3))
    except horovod._run_api.RunError as e:
        print("RUNERROR", e)
