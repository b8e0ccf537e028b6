"""Worker for test_observe.py: STEPS steps of DistributedOptimizer on a small two-layer model
(its first layer, 256 KiB of float32, is large enough to be sparsified), SLEEP seconds apart.
With --timeline PATH every rank calls hvd.start_timeline(PATH) before step START and
hvd.stop_timeline() after step STOP."""

import argparse
import time

import torch

import sparsync.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--timeline")
p.add_argument("--start", type=int, default=2)
p.add_argument("--stop", type=int, default=5)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
hvd.init()
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
gen = torch.Generator().manual_seed(hvd.rank())
for step in range(args.steps):
    if args.timeline and step == args.start:
        hvd.start_timeline(args.timeline)
    x = torch.randn(32, 256, generator=gen)
    y = torch.randint(0, 10, (32,), generator=gen)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if args.timeline and step == args.stop:
        hvd.stop_timeline()
    print("step", step, flush=True)
    time.sleep(args.sleep)
print("done", hvd.rank(), flush=True)
hvd.shutdown()
