"""Worker: every collective of sparsync.torch; writes its results to $OUT_DIR/rank<r>.npz."""

import os

import numpy as np
import torch

import cases
import sparsync.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
out = {}
for case, (shape, dtype) in cases.ALLREDUCE_CASES.items():
    x = torch.from_numpy(cases.allreduce_input(case, r))
    if dtype == "bfloat16":
        x = x.to(torch.bfloat16)
    y = hvd.allreduce(x, name="ar." + case)
    assert y.dtype == x.dtype and tuple(y.shape) == tuple(shape), (y.dtype, y.shape)
    out["ar." + case] = (y.float() if dtype == "bfloat16" else y).numpy()

# A named op used a second time (round 2) and an unnamed one; Sum; integers.
x = torch.from_numpy(cases.allreduce_input("f32_1000", r))
out["ar.again"] = hvd.allreduce(x * 2, name="ar.f32_1000").numpy()
out["ar.sum_noname"] = hvd.allreduce(x, op=hvd.Sum).numpy()
out["ar.int64_sum"] = hvd.allreduce(torch.arange(5) * (r + 1), op=hvd.Sum).numpy()
h = hvd.allreduce_async(torch.ones(3) * r, name="async")
while not hvd.poll(h):
    pass
out["ar.async"] = hvd.synchronize(h).numpy()
out["ar.fp16_compression"] = hvd.allreduce(
    torch.from_numpy(cases.allreduce_input("f32_7", r)), name="fp16c",
    compression=hvd.Compression.fp16).numpy()

out["ag"] = hvd.allgather(torch.from_numpy(cases.allgather_input(r)), name="ag").numpy()
out["ag.noname"] = hvd.allgather(torch.tensor([r, r], dtype=torch.int32)).numpy()
root = n - 1
out["bc"] = hvd.broadcast(torch.from_numpy(cases.broadcast_input(r)), root, name="bc").numpy()
out["bc.obj"] = np.array(hvd.broadcast_object({"from": r}, root_rank=root)["from"])
out["ag.obj"] = np.array([o["r"] for o in hvd.allgather_object({"r": r})])
np.savez(os.path.join(os.environ["OUT_DIR"], "rank%d.npz" % r), **out)
hvd.shutdown()
print("worker %d of %d done" % (r, n))
