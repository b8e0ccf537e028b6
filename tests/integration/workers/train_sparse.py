"""Worker: 30 steps of DistributedOptimizer on a small classifier with whatever compressor the
daemons were started with; writes its loss history and final parameters. ONE_TENSOR=1: a single
linear layer without bias."""

import json
import os

import numpy as np
import torch

import sparsync.torch as hvd

torch.set_num_threads(1)
hvd.init()
r = hvd.rank()
torch.manual_seed(0)
if os.environ.get("ONE_TENSOR"):  # one gradient per step: its merge group cannot vary
    model = torch.nn.Sequential(torch.nn.Linear(128, 10, bias=False))
else:
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
sparsify = None
if os.environ.get("SPARSIFY"):  # "name:density"
    name, density = os.environ["SPARSIFY"].split(":")
    sparsify = hvd.Sparsify(name, float(density))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                               named_parameters=model.named_parameters(), sparsify=sparsify)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
teacher = torch.randn(128, 10, generator=torch.Generator().manual_seed(99))
x = torch.randn(256, 128, generator=torch.Generator().manual_seed(r))
y = (x @ teacher).argmax(1)
losses = []
for step in range(30):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
# Explicit collectives are exact whatever the compressor.
v = torch.arange(10000, dtype=torch.float32) * (r + 1)
assert torch.equal(hvd.allreduce(v, name="exact"), torch.arange(10000, dtype=torch.float32) *
                   (hvd.size() + 1) / 2)
out = os.environ["OUT_DIR"]
np.savez(os.path.join(out, "rank%d.npz" % r),
         **{k: v.detach().numpy() for k, v in model.state_dict().items()})
with open(os.path.join(out, "rank%d.json" % r), "w") as f:
    json.dump(losses, f)
hvd.shutdown()
