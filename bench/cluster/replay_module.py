"""A torch module that replays a model profile's backward: what the torch-based peers train.

The module has one parameter per gradient tensor of the profile, in forward order, chained
through a custom autograd Function per tensor whose backward sleeps until that tensor's gradient
is due (model_profile.Schedule, measured from the start of backward) and then returns the
parameter's own (random, fixed-seed) values as its gradient. Hooks on the parameters (DDP's
buckets, Horovod's DistributedOptimizer) see the gradients arrive in the profile's backward
order, so their reductions overlap the replayed backward as in real training.

    module = ReplayModule(schedule, seed, forward=True)
    out = module(torch.zeros(()))     # waits the forward time
    module.clock.start = time.perf_counter()
    out.backward()                     # gradients become ready on the profile's schedule
"""

import time

import torch


class _Clock:
    """Shared by the replay functions: when backward started and when each gradient is due."""

    def __init__(self, schedule):
        self.ready_s = schedule.ready_s
        self.start = 0.0
        self.lag = 0.0

    def wait_for(self, index):
        due = self.start + self.ready_s[index]
        while True:
            left = due - time.perf_counter()
            if left <= 0:
                break
            time.sleep(left)
        self.lag = max(self.lag, time.perf_counter() - due)


class _ReplayLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, param, clock, index):
        ctx.clock, ctx.index = clock, index
        ctx.save_for_backward(param)
        return h.clone()

    @staticmethod
    def backward(ctx, grad_h):
        ctx.clock.wait_for(ctx.index)
        param, = ctx.saved_tensors
        return grad_h, param, None, None


class ReplayModule(torch.nn.Module):
    def __init__(self, schedule, seed, forward):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.clock = _Clock(schedule)
        self.forward_s = schedule.forward_s if forward else 0.0
        # Forward order is the reverse of backward order; DDP buckets parameters in reverse.
        self.order = list(range(len(schedule)))[::-1]
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(schedule.shapes[i], generator=gen))
             for i in self.order])

    def forward(self, h):
        if self.forward_s:
            time.sleep(self.forward_s)
        for param, index in zip(self.params, self.order):
            h = _ReplayLayer.apply(h, param, self.clock, index)
        return h
