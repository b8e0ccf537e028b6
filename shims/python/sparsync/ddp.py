"""A DistributedDataParallel communication hook that reduces DDP's buckets through sparsyncd.

Two lines turn a torchrun + DDP script into one whose gradients the node's daemon reduces with
its compressor and planner (each DDP bucket is one of the daemon's gradient tensors, named
``ddp.<model>.bucket.<index>``)::

    import sparsync.ddp                      # or: from sparsync.torch import ddp
    sparsync.ddp.register(ddp_model)         # after DistributedDataParallel(model)

The worker must reach a daemon (started by sparsyncrun, or by hand) whose job has the same
ranks as the torch.distributed group: rank r of DDP must be rank r of sparsync (checked).
``register`` calls ``sparsync.torch.init()`` when needed.

Each hook call copies the bucket into its shared region and posts it; a waiter thread owned by
the hook state waits for the daemon, writes the average back into the bucket and completes the
bucket's future, so reduction overlaps the rest of backward, as DDP's own allreduce does. With
SPARSYNC_COMPRESSOR=none (or ``sparsify=Dense()``) the result is the exact average, as DDP's.
"""

import itertools
import queue
import threading

import torch

from sparsync import _torch_state as shared
from sparsync import _wire as W
from sparsync._errors import SparsyncError

_models = itertools.count()


class SparsyncHookState:
    """What the hook keeps for one DDP model: a registration per bucket and the waiter thread
    that completes the buckets' futures (stopped by close(), or when the process exits)."""

    def __init__(self, name, sparsify):
        self.name = name
        self.sparsify = sparsify
        self.regs = {}  # bucket index -> registration (remade when its size or dtype changes)
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._wait_loop, name="sparsync-ddp-" + name,
                                        daemon=True)
        self._thread.start()

    def registration(self, index, flat):
        wire, _ = shared.wire_dtype("allreduce", flat.dtype, shared.Average)
        if wire not in (W.FLOAT32, W.FLOAT64, W.FLOAT16, W.BFLOAT16):
            raise SparsyncError("DDP bucket %d has dtype %s; sparsync reduces floating-point "
                                "gradients" % (index, flat.dtype))
        spec = (flat.numel(), flat.dtype)
        reg = self.regs.get(index)
        if reg is not None and reg.spec == spec:
            return reg
        conn = shared.client()
        if reg is not None:  # DDP rebuilt its buckets after the first step
            conn.unregister(reg)
        compressor, density = self.sparsify.wire if self.sparsify else (0, 0.0)
        reg = conn.register("ddp.%s.bucket.%d" % (self.name, index), W.OP_GRADIENT, wire,
                            (flat.numel(),), shared.Average, 0, compressor, density)
        reg.spec = spec
        self.regs[index] = reg
        return reg

    def submit(self, reg, flat, future):
        self._queue.put((reg, flat, future))

    def _wait_loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            reg, flat, future = item
            try:
                shared.wait(shared.client(), reg)
                with shared.state.lock:
                    flat.copy_(shared.buffer_view(reg, flat.dtype).view(flat.shape))
                future.set_result(flat)
            except BaseException as e:  # noqa: B902 -- DDP raises it from backward
                future.set_exception(e)

    def close(self):
        self._queue.put(None)
        self._thread.join()
        conn = shared.state.client
        for reg in self.regs.values():
            if conn is not None:
                conn.unregister(reg)
        self.regs.clear()


def _hook(state, bucket):
    flat = bucket.buffer()
    host = flat if flat.device.type == "cpu" else flat.detach().cpu()
    future = torch.futures.Future()
    with shared.state.lock:
        reg = state.registration(bucket.index(), host)
        shared.buffer_view(reg, host.dtype).copy_(host.reshape(-1))
        with shared.collective_errors():
            shared.client().post(reg)
    state.submit(reg, host, future)
    if host is flat:
        return future
    return future.then(lambda f: flat.copy_(f.value()))


def register(ddp_model, sparsify=None, name=None):
    """Registers the sparsync hook on `ddp_model` (a DistributedDataParallel) and returns its
    state. `sparsify` (e.g. ``sparsync.torch.TopK(density=0.01)``) overrides the daemons'
    SPARSYNC_COMPRESSOR for these buckets; `name` tells models apart (default: their order)."""
    import torch.distributed as dist

    from sparsync import torch as hvd

    hvd.init()
    if dist.is_initialized() and (dist.get_rank() != hvd.rank()
                                  or dist.get_world_size() != hvd.size()):
        raise SparsyncError("DDP has rank %d of %d but sparsyncd gives this worker rank %d of %d: "
                            "start the daemons for the same job (sparsyncrun sets both)"
                            % (dist.get_rank(), dist.get_world_size(), hvd.rank(), hvd.size()))
    state = SparsyncHookState(name or str(next(_models)), sparsify)
    ddp_model.register_comm_hook(state, _hook)
    return state
