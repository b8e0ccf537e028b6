"""Worker: in-place explicit ops (allreduce_, broadcast_) give the exact result and keep every
other tensor's data, whether the caller's tensor moves into the op's shared region (no copy
out, and no copy in when the same tensor comes back to the same named op) or takes the copying
path. Raises on the first wrong value; prints what moved."""

import torch

import sparsync.torch as hvd

torch.set_num_threads(1)
hvd.init()
rank, size = hvd.rank(), hvd.size()
N = 1000


# Integers below 2**24: every sum and every division by 2 or 4 is exact in float32.
def data(seed, dtype=torch.float32):
    return (torch.arange(N, dtype=torch.float64) * (seed + 1) + rank).to(dtype)


def mean_of(seed, dtype=torch.float32):
    parts = [(torch.arange(N, dtype=torch.float64) * (seed + 1) + r).to(dtype) for r in range(size)]
    return (sum(p.to(torch.float64) for p in parts) / size).to(dtype)


def check(what, got, want):
    if not torch.equal(got, want):
        raise AssertionError("%s: rank %d got %s, want %s" % (what, rank, got[:4], want[:4]))


moved = []

# An unnamed allreduce_ of a lone tensor: the tensor moves into the (temporary) region.
t = data(0)
before = t.data_ptr()
hvd.allreduce_(t)
check("unnamed allreduce_", t, mean_of(0))
moved.append(("unnamed", t.data_ptr() != before))
t.copy_(data(1))
hvd.allreduce_(t)
check("unnamed allreduce_ again", t, mean_of(1))

# A named loop: after the first step the tensor lives in the region; each step's new values
# (written in place, as a script does) are the input.
a = data(2)
for step in range(3):
    a.copy_(data(2 + step))
    hvd.allreduce_(a, name="loop")
    check("named allreduce_ step %d" % step, a, mean_of(2 + step))
    if step == 0:
        home = a.data_ptr()
    elif a.data_ptr() != home:
        raise AssertionError("the named tensor left its region")
moved.append(("named", a.data_ptr() != 0))

# Another tensor through the same name: `a` first gets memory of its own, with its values.
b = data(7)
hvd.allreduce_(b, name="loop")
check("second tensor on the name", b, mean_of(7))
check("first tensor kept", a, mean_of(4))
moved.append(("evicted", a.data_ptr() != home))

# `b` now lives there, and a view of it shares the region: `a` through the name again must
# leave both b and its view as they were.
view = b[10:20]
hvd.allreduce_(a, name="loop")
check("first tensor back on the name", a, mean_of(4))  # the same values on every rank
check("view-holding tensor kept", b, mean_of(7))
check("its view kept", view, mean_of(7)[10:20])

# Out of place through a name whose region holds a tensor: the input stays as it was.
c = data(8)
hvd.allreduce_(c, name="oop")
out = hvd.allreduce(c, name="oop")
check("out-of-place result", out, mean_of(8))
check("out-of-place input kept", c, mean_of(8))

# A tensor with a view, a Parameter's .data, integer averages and a postscale: copied out.
d = data(9)
dv = d[:5]
before = d.data_ptr()
hvd.allreduce_(d)
check("tensor with a view", d, mean_of(9))
check("its view", dv, mean_of(9)[:5])
if d.data_ptr() != before:
    raise AssertionError("a tensor with a view moved")
p = torch.nn.Parameter(data(10))
hvd.allreduce_(p.data, name="param")
check("parameter", p.detach(), mean_of(10))
i = data(11, torch.int64)
hvd.allreduce_(i, name="int")
want = sum((torch.arange(N, dtype=torch.int64) * 12 + r) for r in range(size))
check("integer average", i, torch.div(want, size, rounding_mode="floor"))
s = data(12)
hvd.allreduce_(s, name="post", postscale_factor=2.0)
check("postscale", s, mean_of(12) * 2)

# broadcast_: the root's values on every rank; a named loop with new values each step.
for step in range(3):
    e = data(13 + step) if step == 0 else e
    e.copy_(data(13 + step))
    hvd.broadcast_(e, root_rank=size - 1, name="bcast")
    want = (torch.arange(N, dtype=torch.float64) * (14 + step) + size - 1).to(torch.float32)
    check("broadcast_ step %d" % step, e, want)
u = data(20)
hvd.broadcast_(u, root_rank=0)
check("unnamed broadcast_", u, (torch.arange(N, dtype=torch.float64) * 21).to(torch.float32))

# Async in place, two in flight at once.
x, y = data(21), data(22)
hx, hy = hvd.allreduce_async_(x, name="ax"), hvd.allreduce_async_(y, name="ay")
hvd.synchronize(hy)
hvd.synchronize(hx)
check("async x", x, mean_of(21))
check("async y", y, mean_of(22))

print("rank %d moved: %s" % (rank, moved), flush=True)
hvd.shutdown()
