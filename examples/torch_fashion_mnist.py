"""Fashion-MNIST with a small CNN, data-parallel through sparsync (Horovod's PyTorch API).

    sparsyncrun -np 4 python examples/torch_fashion_mnist.py

Reads the Debian package files of dataset-fashion-mnist (no downloads). Each worker trains on
its own shard; DistributedOptimizer averages the gradients through the daemons. Rank 0 prints
the per-epoch training loss (averaged over workers) and the test accuracy.
"""

import argparse
import gzip
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import sparsync.torch as hvd

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load(split):
    images = read_idx("%s/%s-images-idx3-ubyte.gz" % (DATA, split), 16).reshape(-1, 1, 28, 28)
    labels = read_idx("%s/%s-labels-idx1-ubyte.gz" % (DATA, split), 8)
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate per worker; "
                   "scaled by sqrt(number of workers)")
    args = p.parse_args()

    torch.set_num_threads(1)  # several workers share few cores
    hvd.init()
    torch.manual_seed(0)
    rank, size = hvd.rank(), hvd.size()

    train_x, train_y = load("train")
    test_x, test_y = load("t10k")
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(1234))
    shard = order[rank::size]
    steps = (len(train_x) // size) // args.batch_size  # the same on every worker
    test_shard = torch.arange(rank, len(test_x), size)

    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * size ** 0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    if rank == 0:
        print("Fashion-MNIST on %d workers (%d nodes): %d steps/epoch of %d x %d images"
              % (size, hvd.cross_size(), steps, size, args.batch_size))
    start = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(epoch))]
        total = 0.0
        for i in range(steps):
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            loss.backward()
            optimizer.step()
            total += loss.item()
        train_loss = hvd.allreduce(torch.tensor(total / steps), name="train_loss").item()

        model.eval()
        with torch.no_grad():
            pred = model(test_x[test_shard]).argmax(1)
            correct = (pred == test_y[test_shard]).sum()
        correct = hvd.allreduce(correct.reshape(1), op=hvd.Sum, name="test_correct").item()
        if rank == 0:
            print("epoch %d: train loss %.4f, test accuracy %.2f %% (%.1f s)"
                  % (epoch, train_loss, 100.0 * correct / len(test_x),
                     time.monotonic() - start))
    hvd.shutdown()


if __name__ == "__main__":
    main()
