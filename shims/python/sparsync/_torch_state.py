"""What sparsync.torch and its DistributedOptimizer (_torch_optimizer) share: the worker's
connection to its daemon and the state around it, and the helpers that move tensors in and out
of shared regions. Both import this module; neither imports the other's private names.
"""

import contextlib
import ctypes
import threading
import weakref

import torch

from sparsync import _wire as W
from sparsync._errors import HorovodInternalError, SparsyncError

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
        self.first_specs = {}  # (kind, name) -> the spec it was first registered with
        self.in_flight = set()  # (kind, name) of named ops posted and not yet synchronized
        self.handles = {}      # handle -> _Pending of sparsync.torch
        self.next_handle = 0


state = State()

def digest(text, size):
    """`size` bytes of a hash of `text`, the same in every process (group keys, daemon names)."""
    import hashlib

    return hashlib.blake2b(text.encode(), digest_size=size).digest()


_grouping = threading.local()  # .group: (key, size) while a grouped op posts its parts


@contextlib.contextmanager
def grouped(name, size):
    """While a grouped collective posts its `size` parts: each registration is one of a group of
    `size` whose key is a hash of `name` (the group's name, the same on every rank), and the
    daemon schedules the group as one. A group of one is no group."""
    key = int.from_bytes(digest(name, 8), "little") or 1
    outer = getattr(_grouping, "group", None)
    _grouping.group = (key, size) if size >= 2 else None
    try:
        yield
    finally:
        _grouping.group = outer


def current_group():
    """The (key, size) of the grouped collective being posted by this thread, or None."""
    return getattr(_grouping, "group", None)


def client():
    """The open connection; ValueError (as Horovod's) before init()."""
    if state.client is None:
        raise ValueError("sparsync has not been initialized; use hvd.init().")
    return state.client


def wait(conn, reg, stream=None):
    """Waits for the posted round of `reg` on `conn`, as long as the daemon's timeout allows.

    A failed collective raises HorovodInternalError (a SparsyncError), as Horovod's do."""
    # Called once per gradient per step: a try costs less than collective_errors()'s generator.
    try:
        conn.wait(reg, state.timeout_s, state.timeout_hint, stream)
    except SparsyncError as e:
        _reraise_as_collective_error(e)


@contextlib.contextmanager
def collective_errors():
    """Turns the daemon's refusal or failure of a collective (a SparsyncError with a status:
    a mismatch between ranks, a dead peer, a timeout) into HorovodInternalError."""
    try:
        yield
    except SparsyncError as e:
        _reraise_as_collective_error(e)


def _reraise_as_collective_error(e):
    """Raises `e` (being handled) as collective_errors() says."""
    if isinstance(e, HorovodInternalError) or e.status is None:
        raise e
    raise HorovodInternalError(str(e), e.status) from e


class Deferred:
    """A handle of an operation made of other handles (grouped ops, reductions by allgather):
    sparsync.torch.synchronize(handle) returns `finish(...)` of its parts' results."""

    def __init__(self, parts, finish):
        self.parts, self.finish = list(parts), finish
        self.done = False


def buffer_view(reg, dtype):
    """A flat torch tensor of `dtype` over the registration's shared region (no copy)."""
    raw = torch.from_numpy(reg.raw())
    if raw.numel() == 0:
        return torch.empty(0, dtype=dtype)
    return raw.view(dtype)


def _storage_use_count(t):
    """How many references hold `t`'s storage (one of them this function's own), or None where
    this torch cannot say. torch 2 has the call; torch 1.x's storage is a c10::StorageImpl whose
    first field after the vtable pointer is its plain reference count (c10::intrusive_ptr_target),
    which is read in place."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is not None:
        return use_count(t.untyped_storage()._cdata)
    if int(torch.__version__.split(".")[0]) >= 2:
        return None
    storage = t.storage()._storage  # the TypedStorage's UntypedStorage: one reference
    return ctypes.c_size_t.from_address(storage._cdata + ctypes.sizeof(ctypes.c_void_p)).value


def _fits(t, region):
    """`t` has the layout of the flat shared tensor `region`: CPU, its dtype and size, dense."""
    return (t.device.type == "cpu" and t.dtype == region.dtype and t.numel() == region.numel()
            and t.numel() > 0 and t.is_contiguous())


def lives_in(t, region):
    """`t` is exactly the flat shared tensor `region`, in shape: its data, dtype and size."""
    return _fits(t, region) and t.data_ptr() == region.data_ptr()


def may_move_into_region(t, region):
    """Whether `t`'s storage may be replaced by `region` (tensor.set_) without anyone noticing
    but by its data pointer: a CPU tensor of the region's dtype and size, contiguous, no view,
    not pinned, not requiring grad, and the only tensor over its storage (no view, .data alias
    or Parameter shares it, so none would be left on the old memory)."""
    if not _fits(t, region) or t.requires_grad or t._base is not None or t.is_pinned():
        return False
    users = _storage_use_count(t)
    return users is not None and users <= 2  # the tensor's and the query's


def move_into_region(t, region):
    """Makes `t` a tensor over `region` (after may_move_into_region)."""
    with torch.no_grad():
        t.set_(region.view(t.shape))


def give_region(reg, t):
    """`t` now lives in `reg`'s region: a later op of `reg` must move it out first
    (release_region)."""
    reg.owner = weakref.ref(t)


def region_owner(reg, region):
    """The tensor living in `reg`'s region (give_region) while it still does, else None."""
    owner = reg.owner() if reg.owner is not None else None
    if owner is None or owner.data_ptr() != region.data_ptr():
        reg.owner = None
        return None
    return owner


def release_region(reg, region):
    """Before `reg`'s region takes another op's data: the tensor that lives there gets memory of
    its own, by one copy. Where views of it share the region and it cannot move, it stays, and
    this returns a copy of the region's data to put back after the op (restore_region)."""
    owner = region_owner(reg, region)
    if owner is None:
        return None
    if may_move_into_region(owner, region):
        owner.data = region.clone().view(owner.shape)  # .data: autograd's version stays
        reg.owner = None
        return None
    return region.clone()


def restore_region(region, kept):
    """Puts back what release_region kept."""
    if kept is not None:
        region.copy_(kept)


def wire_dtype(kind, dtype, reduce_op):
    """(wire dtype code, torch dtype sent) for `dtype` in a `kind` collective."""
    if dtype in WIRE_DTYPES and not (kind == "allreduce" and dtype == torch.uint8):
        return WIRE_DTYPES[dtype], dtype
    if dtype in (torch.bool, torch.int8) and kind != "allreduce":
        return W.UINT8, torch.uint8  # bit-exact bytes for broadcast and allgather
    if dtype in (torch.bool, torch.int8, torch.uint8, torch.int16):
        return W.INT32, torch.int32
    raise SparsyncError(f"sparsync does not support tensors of {dtype}")
