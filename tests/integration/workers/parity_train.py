"""Worker: DistributedOptimizer's Horovod options, sparse gradients, join and SyncBatchNorm.

Each check compares against a single-process computation over every rank's data (which each rank
can make, the data being a function of the rank). Prints "PARITY TRAIN OK".
"""

import copy
import sys

import torch

import sparsync.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


def check(name, ok, detail=""):
    if not ok:
        print("FAILED %s %s" % (name, detail), flush=True)
        sys.exit(1)


def batch(k, step, rows=4):
    g = torch.Generator().manual_seed(100 * step + k)
    return torch.rand(rows, 6, generator=g), torch.rand(rows, 2, generator=g)


# --- gradient_predivide_factor: the same average (1/f before the sum, f/size after) -------------
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
results = {}
for f in (1.0, 4.0):
    model = copy.deepcopy(base)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=[("predivide%g.%s" % (f, k), p)
                                                     for k, p in model.named_parameters()],
                                   gradient_predivide_factor=f)
    for step in range(3):
        x, y = batch(r, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    results[f] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
# The reference: one process over all ranks' data, the gradient averaged over ranks.
ref = copy.deepcopy(base)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(3):
    ref_opt.zero_grad()
    loss = sum(torch.nn.functional.mse_loss(ref(batch(k, step)[0]), batch(k, step)[1])
               for k in range(n)) / n
    loss.backward()
    ref_opt.step()
expected = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
check("predivide 1", torch.allclose(results[1.0], expected, atol=1e-6))
check("predivide 4", torch.allclose(results[4.0], expected, atol=1e-6),
      str((results[4.0] - expected).abs().max()))

# --- sparse gradients: nn.Embedding(sparse=True), by allgather and as dense ---------------------
def embedding_run(sparse_as_dense, tag):
    torch.manual_seed(1)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                   named_parameters=[("emb.%s" % tag, emb.weight)],
                                   sparse_as_dense=sparse_as_dense)
    for step in range(2):
        idx = torch.tensor([(r + step) % 10, (2 * r + 3) % 10])
        opt.zero_grad()
        emb(idx).sum().backward()
        check("sparse grad is sparse", emb.weight.grad.is_sparse)
        opt.step()
        check("grad stays sparse (%s)" % tag, emb.weight.grad.is_sparse)
    return emb.weight.detach().clone()


torch.manual_seed(1)
ref_emb = torch.nn.Embedding(10, 3)
with torch.no_grad():
    w = ref_emb.weight.clone()
    for step in range(2):
        grad = torch.zeros_like(w)
        for k in range(n):
            for i in ((k + step) % 10, (2 * k + 3) % 10):
                grad[i] += 1.0 / n
        w -= 0.5 * grad
check("sparse allgather", torch.allclose(embedding_run(False, "gather"), w, atol=1e-6))
check("sparse as dense", torch.allclose(embedding_run(True, "dense"), w, atol=1e-6))

# --- SyncBatchNorm equals BatchNorm over the global batch --------------------------------------
torch.manual_seed(2)
xs = [torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(k)) * (k + 1) + k
      for k in range(n)]
sync_bn = hvd.SyncBatchNorm(4)
bn = torch.nn.BatchNorm1d(4)
for _ in range(2):
    x_local = xs[r].clone().requires_grad_()
    x_all = torch.cat(xs).clone().requires_grad_()
    out = sync_bn(x_local)
    ref_out = bn(x_all)
    check("sync bn forward", torch.allclose(out, ref_out[3 * r:3 * r + 3], atol=1e-5),
          str((out - ref_out[3 * r:3 * r + 3]).abs().max()))
    (out * torch.arange(4.0).view(1, 4, 1)).sum().backward()
    (ref_out * torch.arange(4.0).view(1, 4, 1)).sum().backward()
    check("sync bn input grad", torch.allclose(x_local.grad, x_all.grad[3 * r:3 * r + 3],
                                               atol=1e-5))
    check("sync bn weight grad", torch.allclose(hvd.allreduce(sync_bn.weight.grad, op=hvd.Sum),
                                                bn.weight.grad, atol=1e-4))
    sync_bn.weight.grad = sync_bn.bias.grad = bn.weight.grad = bn.bias.grad = None
check("sync bn running mean", torch.allclose(sync_bn.running_mean, bn.running_mean, atol=1e-5))
check("sync bn running var", torch.allclose(sync_bn.running_var, bn.running_var, atol=1e-4))
sync_bn.eval()
bn.eval()
check("sync bn eval", torch.allclose(sync_bn(xs[r]), bn(xs[r]), atol=1e-5))

# --- join: rank k trains k+1 steps; joined ranks contribute zeros; last to join is n-1 ----------
model = torch.nn.Linear(6, 2, bias=False)
with torch.no_grad():
    model.weight.fill_(0.5)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                               named_parameters=[("join.w", model.weight)])
grads_seen = []
for step in range(r + 1):
    x, y = batch(r, step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y, reduction="sum").backward()
    opt.synchronize()
    grads_seen.append(model.weight.grad.clone())
    with opt.skip_synchronize():
        opt.step()
    # Explicit collectives while ranks below `step` have joined (from step 2 on, every worker of
    # node 0): they add nothing, and no one waits for them.
    active = list(range(step, n))
    got = hvd.allreduce(torch.tensor([float(r + 1)]), name="join.sum.%d" % step, op=hvd.Sum)
    check("join allreduce %d" % step, float(got) == sum(k + 1 for k in active), str(got))
    got = hvd.allreduce(torch.tensor([float(r + 1)]), name="join.avg.%d" % step)
    check("join average divides by size %d" % step,
          abs(float(got) - sum(k + 1 for k in active) / n) < 1e-6, str(got))
    got = hvd.allgather(torch.full((1, 2), float(r)), name="join.gather.%d" % step)
    check("join allgather %d" % step, got[:, 0].tolist() == [float(k) for k in active], str(got))
    got = hvd.broadcast(torch.tensor([float(r)]), root_rank=n - 1, name="join.bcast.%d" % step)
    check("join broadcast %d" % step, float(got) == n - 1, str(got))
last = hvd.join()
check("join returns the last rank", last == n - 1, "got %d" % last)
# The expected gradient of step s: ranks with more than s steps contribute, divided by n.
with torch.no_grad():
    w = torch.full((2, 6), 0.5)
    for step in range(r + 1):
        total = torch.zeros(2, 6)
        for k in range(n):
            if step <= k:
                m = torch.nn.Linear(6, 2, bias=False)
                m.weight.copy_(w)
                with torch.enable_grad():
                    x, y = batch(k, step)
                    torch.nn.functional.mse_loss(m(x), y, reduction="sum").backward()
                total += m.weight.grad
        check("join step %d gradient" % step, torch.allclose(grads_seen[step], total / n,
                                                             atol=1e-5))
        w -= total / n
print("PARITY TRAIN OK", flush=True)
hvd.shutdown()
