"""Worker (torch 2.x): DistributedOptimizer under torch.compile and with AMP's GradScaler.

Both runs must equal one process training on every rank's batch (the average of the ranks'
gradients), and the optimizer must hook with register_post_accumulate_grad_hook. Prints
"TORCH2 OK".
"""

import copy
import sys

import torch

import sparsync.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
STEPS = 5


def check(name, ok, detail=""):
    if not ok:
        print("FAILED %s %s" % (name, detail), flush=True)
        sys.exit(1)


def batch(k, step):
    g = torch.Generator().manual_seed(100 * step + k)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
ref = copy.deepcopy(base)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(STEPS):
    ref_opt.zero_grad()
    sum(torch.nn.functional.mse_loss(ref(batch(k, step)[0]), batch(k, step)[1])
        for k in range(n)).div(n).backward()
    ref_opt.step()
want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# torch.compile (aot_eager: dynamo and AOTAutograd without a C++ compile of the kernels).
compiled = torch.compile(copy.deepcopy(base), backend="aot_eager")
opt = hvd.DistributedOptimizer(torch.optim.SGD(compiled.parameters(), lr=0.1),
                               named_parameters=[("compiled." + k, p)
                                                 for k, p in compiled.named_parameters()])
check("post-accumulate hooks", all(not isinstance(h, torch.autograd.graph.Node)
                                   for h in opt._grad_accs))
for step in range(STEPS):
    x, y = batch(r, step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(compiled(x), y).backward()
    opt.step()
check("torch.compile", torch.allclose(flat(compiled), want, atol=1e-5),
      str((flat(compiled) - want).abs().max()))

# AMP's GradScaler, in Horovod's pattern: synchronize, unscale_, step without synchronizing.
model = copy.deepcopy(base)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=[("amp." + k, p)
                                                 for k, p in model.named_parameters()])
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for step in range(STEPS):
    x, y = batch(r, step)
    opt.zero_grad()
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
check("GradScaler", torch.allclose(flat(model), want, atol=1e-5),
      str((flat(model) - want).abs().max()))
print("TORCH2 OK", torch.__version__, flush=True)
hvd.shutdown()
