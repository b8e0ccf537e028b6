"""What sparsync.torch and its DistributedOptimizer (_torch_optimizer) share: the worker's
connection to its daemon and the state around it, and the helpers that move tensors in and out
of shared regions. Both import this module; neither imports the other's private names.
"""

import threading

import torch

from sparsync import _wire as W
from sparsync._errors import SparsyncError

Average = W.REDUCE_AVERAGE
Sum = W.REDUCE_SUM
Adasum = 2  # accepted by name for compatibility; not supported

WIRE_DTYPES = {torch.float32: W.FLOAT32, torch.float64: W.FLOAT64, torch.float16: W.FLOAT16,
               torch.bfloat16: W.BFLOAT16, torch.int32: W.INT32, torch.int64: W.INT64,
               torch.uint8: W.UINT8}

# The daemon fails a stalled collective after SPARSYNC_TIMEOUT_S and says why; the shim gives up
# on its own only this much later, so that the daemon's message is the one users see.
DAEMON_GRACE_S = 5.0


class State:
    """The process's connection (hvd.init() to hvd.shutdown()) and its bookkeeping; `lock`
    guards every field."""

    def __init__(self):
        self.lock = threading.RLock()
        self.client = None
        self.world = None
        self.timeout_s = 300.0 + DAEMON_GRACE_S
        self.timeout_hint = "SPARSYNC_TIMEOUT_S"
        self.noname = {}       # op kind -> next number for unnamed ops
        self.named = {}        # (kind, name) -> registration kept for reuse
        self.in_flight = set()  # (kind, name) of named ops posted and not yet synchronized
        self.handles = {}      # handle -> _Pending of sparsync.torch
        self.next_handle = 0


state = State()


def client():
    """The open connection; ValueError (as Horovod's) before init()."""
    if state.client is None:
        raise ValueError("sparsync has not been initialized; use hvd.init().")
    return state.client


def wait(conn, reg, stream=None):
    """Waits for the posted round of `reg` on `conn`, as long as the daemon's timeout allows."""
    conn.wait(reg, state.timeout_s, state.timeout_hint, stream)


def buffer_view(reg, dtype):
    """A flat torch tensor of `dtype` over the registration's shared region (no copy)."""
    raw = torch.from_numpy(reg.raw())
    if raw.numel() == 0:
        return torch.empty(0, dtype=dtype)
    return raw.view(dtype)


def wire_dtype(kind, dtype, reduce_op):
    """(wire dtype code, torch dtype sent) for `dtype` in a `kind` collective."""
    if dtype in WIRE_DTYPES and not (kind == "allreduce" and dtype == torch.uint8):
        return WIRE_DTYPES[dtype], dtype
    if dtype in (torch.bool, torch.int8) and kind != "allreduce":
        return W.UINT8, torch.uint8  # bit-exact bytes for broadcast and allgather
    if dtype in (torch.bool, torch.int8, torch.uint8, torch.int16):
        return W.INT32, torch.int32
    raise SparsyncError(f"sparsync does not support tensors of {dtype}")
