"""Worker: 20 steps of DistributedOptimizer on a fixed model; writes the parameters.

Also checks that a parameter without a gradient on some workers still gets the average.
"""

import os

import numpy as np
import torch

import sparsync.torch as hvd

import train_model

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
model = train_model.make_model()
if r != 0:  # differ on purpose: broadcast_parameters must fix it
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
opt = torch.optim.SGD(model.parameters(), lr=train_model.LR, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
for step in range(train_model.STEPS):
    x, y = train_model.batch(step, r)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
out = {k: v.detach().numpy() for k, v in model.state_dict().items()}

# Only rank 0 uses `branch`: the others contribute zeros, nobody hangs, all get grad/size.
trunk, branch = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
params = [("trunk." + k, v) for k, v in trunk.named_parameters()] + \
         [("branch." + k, v) for k, v in branch.named_parameters()]
opt2 = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.0),
                                named_parameters=params)
hvd.broadcast_parameters(dict(params), root_rank=0)
x = torch.ones(2, 4)
loss = trunk(x).sum() + (branch(x).sum() if r == 0 else 0.0)
loss.backward()
opt2.step()
out["branch_grad"] = branch.weight.grad.numpy()
out["trunk_grad"] = trunk.weight.grad.numpy()
np.savez(os.path.join(os.environ["OUT_DIR"], "rank%d.npz" % r), **out)
print("worker %d done" % r)
