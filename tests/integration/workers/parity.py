"""Worker: Horovod names of sparsync.torch against Horovod's documented behaviour.

Every rank computes what each result must be from the inputs of all ranks (deterministic in the
rank) and asserts it; a failure exits non-zero with the name of the check. Prints "PARITY OK".
"""

import sys
import time

import numpy as np
import torch

import sparsync.torch as hvd
from sparsync import _wire as W

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


def check(name, ok, detail=""):
    if not ok:
        print("FAILED %s %s" % (name, detail), flush=True)
        sys.exit(1)


def inputs(shape, seed_base=0, dtype=torch.float32):
    """Every rank's input for a case, in rank order."""
    out = []
    for k in range(n):
        g = torch.Generator().manual_seed(1000 * seed_base + k)
        out.append((torch.rand(shape, generator=g) * 4 - 2).to(dtype))
    return out


# --- capability checks: true to this build -----------------------------------------------------
check("gloo", hvd.gloo_built() is True and hvd.gloo_enabled() is True)
check("mpi", hvd.mpi_built() is False and hvd.mpi_enabled() is False)
check("no rocm/ddl/ccl", not (hvd.rocm_built() or hvd.ddl_built() or hvd.ccl_built()))
check("homogeneous", hvd.is_homogeneous() is True)
check("nccl_built is bool or version", isinstance(hvd.nccl_built(), (bool, int)))

# --- Min / Max / Product (exact) and Adasum ------------------------------------------------------
for dtype in (torch.float32, torch.int32, torch.float64):
    xs = inputs((3, 5), 1, torch.float64)
    xs = [(x * 10).to(dtype) for x in xs]
    stacked = torch.stack(xs)
    got = hvd.allreduce(xs[r], op=hvd.Min, name="min.%s" % dtype)
    check("min %s" % dtype, torch.equal(got, stacked.amin(0)))
    got = hvd.allreduce(xs[r], op=hvd.Max)
    check("max %s" % dtype, torch.equal(got, stacked.amax(0)))
    got = hvd.allreduce(xs[r], op=hvd.Product, name="prod.%s" % dtype)
    check("product %s" % dtype, torch.equal(got, stacked.prod(0, dtype=dtype)) and
          got.dtype == dtype)
x = torch.full((4,), float(r + 1))
y = x.clone()
hvd.allreduce_(y, op=hvd.Max)
check("max in place", torch.equal(y, torch.full((4,), float(n))))
if n & (n - 1) == 0:
    # Adasum of orthogonal vectors is their sum; of identical vectors it is the vector itself.
    e = torch.zeros(n)
    e[r] = 1.0
    check("adasum orthogonal", torch.equal(hvd.allreduce(e, op=hvd.Adasum), torch.ones(n)))
    same = torch.arange(6, dtype=torch.float32)
    check("adasum identical", torch.allclose(hvd.allreduce(same, op=hvd.Adasum), same))

# --- barrier, grouped ops ------------------------------------------------------------------------
hvd.barrier()
group = [inputs((7,), 2)[r], inputs((2, 3), 3)[r], torch.arange(4) * (r + 1)]
outs = hvd.grouped_allreduce(group, name="grouped")
check("grouped avg", torch.allclose(outs[0], torch.stack(inputs((7,), 2)).mean(0), atol=1e-6))
check("grouped avg 2", torch.allclose(outs[1], torch.stack(inputs((2, 3), 3)).mean(0),
                                      atol=1e-6))
check("grouped int", torch.equal(outs[2], torch.arange(4) * sum(range(1, n + 1)) // n))
h = hvd.grouped_allreduce_async([torch.ones(3) * r, torch.ones(2)], op=hvd.Sum)
while not hvd.poll(h):
    pass
s3, s2 = hvd.synchronize(h)
check("grouped async", torch.equal(s3, torch.full((3,), float(sum(range(n))))) and
      torch.equal(s2, torch.full((2,), float(n))))
inplace = [torch.ones(2) * r, torch.ones(1) * r]
hvd.grouped_allreduce_(inplace, op=hvd.Sum)
check("grouped in place", float(inplace[0][0]) == sum(range(n)) == float(inplace[1][0]))
g = hvd.grouped_allgather([torch.full((r + 1, 2), float(r)), torch.tensor([r])])
check("grouped allgather", g[0].shape == (n * (n + 1) // 2, 2) and
      torch.equal(g[1], torch.arange(n)))

# A group is one unit of the daemon: with one of its two tensors posted on every rank, neither
# is scheduled (the first is still in flight after a second); once the second is posted, both
# complete. Through the client, to hold the second back.
conn = hvd._client()
key = 0x5EED0F6 + 1
first = conn.register("atomic.0", W.OP_ALLREDUCE, W.FLOAT32, (3,), W.REDUCE_SUM, group=(key, 2))
second = conn.register("atomic.1", W.OP_ALLREDUCE, W.FLOAT32, (2,), W.REDUCE_SUM, group=(key, 2))
first.array(np.float32)[:] = r
second.array(np.float32)[:] = 1
conn.post(first)
time.sleep(1.0)
check("group held until complete", not conn.try_wait(first))
hvd.barrier()  # every rank has looked before any posts the second
conn.post(second)
conn.wait(first, 30)
conn.wait(second, 30)
check("group released whole", first.array(np.float32).tolist() == [sum(range(n))] * 3 and
      second.array(np.float32).tolist() == [n] * 2)
conn.unregister(first)
conn.unregister(second)

# One name, other specs in later calls (as Horovod allows): a broadcast from each root in turn and
# an allreduce whose shape changes, with two workers per node re-registering at their own pace.
for root in range(n):
    got = hvd.broadcast(torch.full((2,), float(r)), root_rank=root, name="bc.each.root")
    check("broadcast name reused, root %d" % root, got.tolist() == [float(root)] * 2, str(got))
for length in (3, 5, 3, 1):
    got = hvd.allreduce(torch.ones(length) * r, name="reshaped", op=hvd.Sum)
    check("allreduce name reused, length %d" % length,
          got.tolist() == [float(sum(range(n)))] * length, str(got))

# --- alltoall with and without splits ------------------------------------------------------------
# Rank r sends (d + 1) rows to rank d, each row [r, d, i].
rows = [torch.tensor([[r, d, i] for i in range(d + 1)]) for d in range(n)]
out, received = hvd.alltoall(torch.cat(rows), splits=torch.tensor([d + 1 for d in range(n)]))
want = torch.cat([torch.tensor([[s, r, i] for i in range(r + 1)]) for s in range(n)])
check("alltoall splits", torch.equal(out, want), str(out))
check("alltoall received", received.tolist() == [r + 1] * n)
even = hvd.alltoall(torch.arange(2 * n) + 100 * r)
check("alltoall even", even.tolist() == [100 * s + 2 * r + j for s in range(n) for j in (0, 1)])

# --- reducescatter: lower ranks get the extra row ------------------------------------------------
full = [torch.arange(2 * n + 1, dtype=torch.float32).reshape(-1, 1) * (k + 1) for k in range(n)]
mine = hvd.reducescatter(full[r], op=hvd.Sum)
counts = [2 + (1 if k < 1 else 0) for k in range(n)]
start = sum(counts[:r])
check("reducescatter", torch.equal(mine, torch.stack(full).sum(0)[start:start + counts[r]]))
avg = hvd.reducescatter(torch.ones(n, 3) * r)
check("reducescatter avg", torch.allclose(avg, torch.full((1, 3), (n - 1) / 2)))

gr = hvd.grouped_reducescatter([torch.ones(n, 2) * r, torch.ones(2 * n) * (r + 1)], op=hvd.Sum)
check("grouped reducescatter", torch.equal(gr[0], torch.full((1, 2), float(sum(range(n))))) and
      torch.equal(gr[1], torch.full((2,), float(sum(range(1, n + 1))))))
sp = torch.sparse_coo_tensor(torch.tensor([[r, 0]]), torch.tensor([[1.0], [2.0]]), (n, 1))
dense = hvd.synchronize(hvd.sparse_allreduce_async(sp, name="sparse", op=hvd.Sum)).to_dense()
want = torch.ones(n, 1)
want[0] += 2.0 * n
check("sparse_allreduce", torch.equal(dense, want), str(dense))

# --- process sets ---------------------------------------------------------------------------------
check("global set", hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r)
# Subsets themselves: test_process_sets.py. Adding the global set's ranks is a duplicate, as in
# Horovod; the global set is never removed.
try:
    hvd.add_process_set(list(range(n)))
    check("global ranks refused", False)
except ValueError as e:
    check("global ranks message", "duplicate" in str(e), str(e))
check("global set not removed", hvd.remove_process_set(hvd.global_process_set) is False)
check("barrier on the global set", hvd.barrier(process_set=hvd.global_process_set) is None)
gs = hvd.global_process_set
check("allreduce on the global set",
      torch.equal(hvd.allreduce(torch.ones(3) * r, op=hvd.Sum, process_set=gs),
                  torch.full((3,), float(sum(range(n))))))
t = torch.ones(2) * r
check("allreduce_ on the global set", hvd.allreduce_(t, process_set=gs) is t and
      torch.allclose(t, torch.full((2,), (n - 1) / 2)))
check("allgather on the global set",
      torch.equal(hvd.allgather(torch.tensor([r]), process_set=gs), torch.arange(n)))
t = torch.ones(2) * r
check("broadcast(_) on the global set",
      torch.equal(hvd.broadcast(torch.ones(2) * r, 1 % n, process_set=gs),
                  torch.full((2,), float(1 % n))) and
      hvd.broadcast_(t, 0, process_set=gs) is t and torch.equal(t, torch.zeros(2)))
check("objects on the global set",
      hvd.broadcast_object({"r": r}, 0, process_set=gs) == {"r": 0} and
      hvd.allgather_object(r, process_set=gs) == list(range(n)))
if n > 1:
    subset = hvd.ProcessSet([0])  # never added: refused before it reaches the daemon
    for what, call in [("allreduce", lambda: hvd.allreduce(torch.ones(1), process_set=subset)),
                       ("allgather", lambda: hvd.allgather(torch.ones(1), process_set=subset)),
                       ("broadcast", lambda: hvd.broadcast(torch.ones(1), 0, process_set=subset)),
                       ("broadcast_object",
                        lambda: hvd.broadcast_object(1, 0, process_set=subset))]:
        try:
            call()
            check(what + " on a subset refused", False)
        except ValueError as e:
            check(what + " on a subset refused", "has not been added" in str(e), str(e))

# --- HorovodInternalError on a failed collective (shapes differ between nodes) -------------------
# The shape follows the node, not the rank: the coordinator sees the difference only once every
# worker has posted, so none is still waiting on the collective above when the job fails (a
# difference between two workers of one node fails the job as soon as the second registers).
if n > 1:
    differ_by = hvd.cross_rank() if hvd.cross_size() > 1 else hvd.local_rank()
    try:
        hvd.allreduce(torch.ones(differ_by + 1), name="mismatch")
        check("mismatch raises", False)
    except hvd.HorovodInternalError as e:
        check("internal error is SparsyncError", isinstance(e, hvd.SparsyncError))

# --- DistributedOptimizer: Horovod's signature ---------------------------------------------------
model = torch.nn.Linear(3, 2)
try:
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bogus_kwarg=1)
    check("unknown keyword", False)
except TypeError:
    pass
try:
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
    check("adasum optimizer refused", False)
except ValueError as e:
    check("adasum message", "op=Average" in str(e))
try:
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                             gradient_predivide_factor=2.0)
    check("predivide with Sum refused", False)
except ValueError:
    pass
try:
    hvd.elastic.run(lambda state: None)
    check("elastic refused", False)
except NotImplementedError as e:
    check("elastic message", "elastic" in str(e))
print("PARITY OK", flush=True)
hvd.shutdown()
