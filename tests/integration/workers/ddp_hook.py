"""Worker: DistributedDataParallel with and without sparsync's communication hook.

argv[1] "none": the hooked model must equal plain DDP within 1e-6 after 20 steps.
argv[1] "topk": the hook sparsifies (TopK); every rank must hold identical parameters, and they
must differ from plain DDP's (the buckets really were sparsified). Prints "DDP HOOK OK".
"""

import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sparsync.ddp
import sparsync.torch as hvd

torch.set_num_threads(1)
mode = sys.argv[1]
r, n = int(os.environ["SPARSYNC_RANK"]), int(os.environ["SPARSYNC_SIZE"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["DDP_PORT"],
                        rank=r, world_size=n)
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                     torch.nn.ReLU(), torch.nn.Linear(512, 8))  # 1.2 MB: beyond the first bucket
plain = DDP(copy.deepcopy(base), bucket_cap_mb=0.25)  # several buckets
hooked = DDP(copy.deepcopy(base), bucket_cap_mb=0.25)
sparsify = hvd.TopK(density=0.05) if mode == "topk" else None
state = sparsync.ddp.register(hooked, sparsify=sparsify)
opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (plain, hooked)]
for step in range(20):
    g = torch.Generator().manual_seed(1000 * step + r)
    x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
    for model, opt in zip((plain, hooked), opts):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
flat = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in (plain, hooked)]
diff = float((flat[0] - flat[1]).abs().max())
print("rank %d: max |plain - hooked| = %.3g over %d buckets" % (r, diff, len(state.regs)))
if mode == "none":
    assert diff <= 1e-6, diff
else:
    everyone = hvd.allgather(flat[1].reshape(1, -1), name="ddp.check")
    assert all(torch.equal(everyone[k], everyone[0]) for k in range(n)), "ranks differ"
    assert diff > 1e-4, "top-k gave DDP's dense result: nothing was sparsified (%g)" % diff
assert len(state.regs) > 1, "expected several DDP buckets"
state.close()
dist.destroy_process_group()
print("DDP HOOK OK", flush=True)
