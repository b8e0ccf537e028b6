"""Worker: hvd.join() with top-k and error feedback, 4 nodes of one worker (test_parity.py).

Rank k trains k + 1 steps, then joins: from step 1 on the nodes of the joined ranks have no
worker taking part, and their daemons join each sparse exchange with zeros. Every rank still
training must receive the same averaged gradient, and explicit collectives between the steps add
nothing for the joined ranks. Prints "JOIN SPARSE OK".
"""

import sys

import torch

import sparsync.torch as hvd

torch.set_num_threads(1)


def check(name, ok, detail=""):
    if not ok:
        print("FAILED %s %s" % (name, detail), flush=True)
        sys.exit(1)


hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for step in range(r + 1):
    g = torch.Generator().manual_seed(100 * r + step)
    x, y = torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.synchronize()
    active = n - step
    for name, p in model.named_parameters():
        # Every active rank holds the same reduced gradient: their sum is `active` times it.
        total = hvd.allreduce(p.grad, name="check.%s.%d" % (name, step), op=hvd.Sum)
        check("same gradient %s step %d" % (name, step),
              torch.allclose(total, p.grad * active, atol=1e-5),
              str((total - p.grad * active).abs().max()))
    with opt.skip_synchronize():
        opt.step()
last = hvd.join()
check("last to join", last == n - 1, str(last))
# After the join every rank takes part again.
got = hvd.allreduce(torch.tensor([1.0]), name="after.join", op=hvd.Sum)
check("all take part after the join", float(got) == n, str(got))
print("JOIN SPARSE OK", flush=True)
hvd.shutdown()
