"""Worker: the same training twice on the same daemons, once with gradients in shared memory
(the default) and once through the copying path (a compressor that is not Compression.none:
one copy in and one out), for each way scripts drive DistributedOptimizer. Writes every step's
parameters and gradients of both runs, and what the shared path did.

Scenarios (argv[1]):
  plain        zero_grad(set_to_none=False), backward, step
  default      zero_grad() (DistributedOptimizer keeps shared gradients, also under torch 2)
  to_none      zero_grad(set_to_none=True): each step's new gradient is copied in once
  passes       backward_passes_per_step=2
  clip         synchronize(), clip_grad_norm_, step() in skip_synchronize()
  assigned     the script assigns p.grad itself, no backward
  layouts      a channels-last conv weight and a transposed (non-contiguous) weight
  dtype        the model turned to float64 after the first steps
  late_group   a parameter group added after construction
"""

import os
import sys

import numpy as np
import torch

import sparsync.torch as hvd

torch.set_num_threads(1)
hvd.init()
rank = hvd.rank()
scenario = sys.argv[1]
STEPS = 4


class Copying(hvd.Compression.none):
    """Compression.none by another name: the optimizer takes its copying path."""


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.fc = torch.nn.Linear(3 * 4 * 4, 5)
        self.head = torch.nn.Linear(5, 2)

    def forward(self, x):
        return self.head(torch.relu(self.fc(torch.relu(self.conv(x)).flatten(1))))


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 2, 4, 4, generator=g), torch.randn(4, 2, generator=g)


def run(compression):
    torch.manual_seed(7)
    model = Net()
    extra = torch.nn.Parameter(torch.randn(6, 2))  # the late group's parameter
    if scenario == "layouts":
        model.conv.weight.data = model.conv.weight.data.to(memory_format=torch.channels_last)
        model.fc.weight.data = model.fc.weight.data.t().contiguous().t()
    named = list(model.named_parameters())
    params = [p for _, p in named]
    if scenario == "late_group":
        named.append(("extra", extra))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.05, momentum=0.9),
                                   named_parameters=named, compression=compression,
                                   backward_passes_per_step=2 if scenario == "passes" else 1)
    steps = []
    in_place = None  # the names whose backward accumulated into shared memory at every step >= 1
    for step in range(STEPS):
        if scenario == "late_group" and step == 1:
            opt.add_param_group({"params": [extra]})
        if scenario == "dtype" and step == 2:
            model.double()  # the same Parameter objects, now float64
        if scenario == "default":
            opt.zero_grad()
        else:
            opt.zero_grad(set_to_none=scenario == "to_none")
        if scenario == "assigned":
            for p in model.parameters():
                p.grad = torch.full_like(p, 0.25 * (rank + 1) * (step + 1))
        else:
            for _ in range(2 if scenario == "passes" else 1):
                x, y = batch(step)
                out = model(x.to(model.head.weight.dtype))
                loss = torch.nn.functional.mse_loss(out, y.to(out.dtype))
                if scenario == "late_group" and step >= 1:
                    loss = loss + (extra ** 2).sum() * (rank + 1)
                loss.backward()
        if step >= 1:
            now = {n for n, p in named if p.grad is not None and id(p) in opt._slots
                   and opt._slots[id(p)].grad is not None
                   and p.grad.data_ptr() == opt._slots[id(p)].grad.data_ptr()}
            in_place = now if in_place is None else in_place & now
        if scenario == "clip":
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        # A gradient read after step() is the average.
        state = {"p." + n: p.detach().clone() for n, p in named}
        state.update({"g." + n: p.grad.detach().clone() for n, p in named if p.grad is not None})
        steps.append(state)
    shared = sorted(n for n, p in named
                    if id(p) in opt._slots and opt._slots[id(p)].grad is not None
                    and p.grad is not None and p.grad.data_ptr() == opt._slots[id(p)].grad.data_ptr())
    opt.unregister()  # the second run registers the same names afresh
    return steps, shared, sorted(in_place)


zero_copy, shared, in_place = run(hvd.Compression.none)
copying, shared_when_copying, _ = run(Copying)
out = {"shared": np.array(shared), "shared_when_copying": np.array(shared_when_copying),
       "in_place": np.array(in_place)}
for step, (a, b) in enumerate(zip(zero_copy, copying)):
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    for key in a:
        out["zero_copy.%d.%s" % (step, key)] = a[key].numpy()
        out["copying.%d.%s" % (step, key)] = b[key].numpy()

# A gradient changed while its reduction is in flight is refused, naming it: in shared memory
# (a race with the daemon) and copied in after set_to_none (a change the result would drop).
for key, to_none in (("in_flight_error", None), ("in_flight_error_copied", True)):
    torch.manual_seed(7)
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    for step in range(2):
        opt.zero_grad() if to_none is None else opt.zero_grad(set_to_none=to_none)
        x, y = batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 1:
            model.fc.weight.grad.mul_(2.0)  # without synchronize()
        try:
            opt.step()
            out[key] = np.array("")
        except hvd.SparsyncError as e:
            out[key] = np.array(str(e))
    opt.unregister()
np.savez(os.path.join(os.environ["OUT_DIR"], "rank%d.npz" % rank), **out)
hvd.shutdown()
print("worker %d done" % rank)
