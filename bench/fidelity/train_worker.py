"""One training run of a fidelity task through the daemons (run under sparsyncrun).

    sparsyncrun -np 4 python bench/fidelity/train_worker.py --task fmnist --epochs 10 --seed 0 \
        --out run.json

The daemons' SPARSYNC_* variables choose the compressor. Rank 0 writes, after every epoch, the
run so far as JSON: per epoch the test metric, the test loss, the training loss (averaged over
workers) and the wall time. With --task fmnist --seed 0 this is the demo's training exactly
(examples/torch_fashion_mnist.py: same model, data order, optimizer and seed).
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402

import sparsync.torch as hvd  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=sorted(tasks.TASKS), default="fmnist")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON written by rank 0 after every epoch")
    args = p.parse_args()

    torch.set_num_threads(1)  # several workers share few cores
    hvd.init()
    torch.manual_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()
    task = tasks.TASKS[args.task](rank, size, args.seed)
    model = task.model()
    optimizer = task.optimizer(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    env = {k: v for k, v in os.environ.items() if k.startswith("SPARSYNC_")
           and k not in ("SPARSYNC_JOB_TOKEN", "SPARSYNC_SOCKET")}
    record = {"task": task.name, "metric": task.metric, "seed": args.seed, "workers": size,
              "nodes": hvd.cross_size(), "steps_per_epoch": task.steps_per_epoch(),
              "parameters": sum(p.numel() for p in model.parameters()), "env": env,
              "epochs": []}
    start = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        model.train()
        total = 0.0
        for x, y in task.batches(epoch):
            optimizer.zero_grad()
            loss = task.loss(model, x, y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        train_loss = hvd.allreduce(torch.tensor(total / task.steps_per_epoch()),
                                   name="train_loss").item()
        model.eval()
        correct, count, summed = task.evaluate(model)
        sums = hvd.allreduce(torch.tensor([correct, count, summed], dtype=torch.float64),
                             op=hvd.Sum, name="test_sums")
        correct, count, summed = sums.tolist()
        row = {"epoch": epoch, "test_metric": 100.0 * correct / count,
               "test_bits": tasks.bits_per_unit(summed, count), "train_loss": train_loss,
               "wall_s": time.monotonic() - start}
        record["epochs"].append(row)
        if rank == 0:
            print("epoch %d: train loss %.4f, %s %.2f %% (%.1f s)"
                  % (epoch, train_loss, task.metric, row["test_metric"], row["wall_s"]),
                  flush=True)
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(record, f, indent=1)
            os.replace(tmp, args.out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
