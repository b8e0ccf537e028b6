"""The Horovod PyTorch API over sparsyncd: ``import sparsync.torch as hvd``.

Every collective goes through the node's daemon: the tensor is copied into a shared region
registered with the daemon, READY is posted, and the result is read back after DONE (an in-place
op's tensor may instead move onto the region: _land). Explicit
allreduce/allgather/broadcast are exact; gradients reduced by DistributedOptimizer use the
GRADIENT op, which the daemon may compress (SPARSYNC_COMPRESSOR).
"""

import atexit
import io
import os
import pickle

import numpy as np
import torch

from sparsync import _client as C
from sparsync import _wire as W
from sparsync._errors import HorovodInternalError, SparsyncError
from sparsync._paths import default_socket_path
from sparsync import _torch_process_sets as _sets
from sparsync._torch_optimizer import (  # noqa: F401  (part of sparsync.torch)
    DGC,
    Compression,
    Dense,
    DistributedOptimizer,
    GaussianK,
    GlobalTopK,
    RandomK,
    Sparsify,
    Threshold,
    TopK,
    Wangni,
)
from sparsync._torch_state import DAEMON_GRACE_S as _DAEMON_GRACE_S
from sparsync._torch_state import Deferred as _Deferred
from sparsync._torch_state import collective_errors as _collective_errors
from sparsync._torch_state import current_group as _current_group
from sparsync._torch_state import digest as _digest
from sparsync._torch_state import Adasum, Average, Sum
from sparsync._torch_state import buffer_view as _buffer_view
from sparsync._torch_state import client as _client
from sparsync._torch_state import state as _state
from sparsync._torch_state import wait as _wait
from sparsync._torch_state import wire_dtype as _wire_dtype
from sparsync._torch_state import give_region as _give_region
from sparsync._torch_state import lives_in as _lives_in
from sparsync._torch_state import may_move_into_region as _may_move_into_region
from sparsync._torch_state import move_into_region as _move_into_region
from sparsync._torch_state import region_owner as _region_owner
from sparsync._torch_state import release_region as _release_region
from sparsync._torch_state import restore_region as _restore_region
from sparsync._world import world_accessors

__all__ = [
    "SparsyncError", "Average", "Sum", "Adasum", "Compression", "init", "shutdown",
    "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather",
    "allgather_async", "allgather_object", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_parameters", "broadcast_optimizer_state",
    "synchronize", "poll", "DistributedOptimizer", "start_timeline", "stop_timeline",
    "HorovodInternalError", "Min", "Max", "Product", "barrier", "join", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_allgather", "grouped_allgather_async", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "ProcessSet", "add_process_set",
    "remove_process_set", "global_process_set", "SyncBatchNorm", "elastic", "nccl_built",
    "gloo_built", "gloo_enabled", "mpi_built", "mpi_enabled", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "is_homogeneous", "mpi_threads_supported",
    "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async",
    "HostsUpdatedInterrupt", "ddp",
]

def _env_float(name, default):
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise SparsyncError("%s=%r is not a number of seconds" % (name, value))


_TIMELINE_ANSWER_S = 30.0  # the daemon answers at once; creating the file may take a moment


def _client_or_raise():
    client = _state.client
    if client is None:
        raise SparsyncError("sparsync is not initialized: call hvd.init() first")
    return client


def _env_int(name, slurm_name, default):
    """(variable, value) of SPARSYNC_<name>, else of Slurm's variable (srun sets SLURM_LOCALID,
    SLURM_PROCID and SLURM_NTASKS in each task), else (None, default)."""
    for var in (name, slurm_name):
        value = os.environ.get(var, "")
        if value:
            try:
                return var, int(value)
            except ValueError:
                raise SparsyncError("%s=%r is not an integer" % (var, value))
    return None, default


def init(comm=None, process_sets=None):
    """Connects this worker to its node's sparsyncd (SPARSYNC_SOCKET). Idempotent.

    process_sets: None, "dynamic" (the same as None: sets can always be added later), or a list
    of hvd.ProcessSet (or of rank lists), added in order with ids 1, 2, ...; every rank must pass
    the same list. A duplicate set raises ValueError (and leaves sparsync uninitialized).
    `comm` is accepted for Horovod's signature; sparsync has no MPI.

    Every SPARSYNC_* setting of a worker is read here; the client library reads none."""
    with _state.lock:
        if _state.client is not None:
            return
        path = os.environ.get("SPARSYNC_SOCKET") or default_socket_path()
        # Unset: the client library reads SPARSYNC_JOB_TOKEN_FILE, or the daemon's token file.
        token = os.environ.get("SPARSYNC_JOB_TOKEN") or None
        token_file = os.environ.get("SPARSYNC_JOB_TOKEN_FILE") or None
        local_var, local = _env_int("SPARSYNC_LOCAL_RANK", "SLURM_LOCALID", 0)
        connect_s = _env_float("SPARSYNC_CONNECT_TIMEOUT_S", 10.0)
        daemon_timeout = _env_float("SPARSYNC_TIMEOUT_S", 300.0)
        _state.timeout_s = daemon_timeout + _DAEMON_GRACE_S
        _state.timeout_hint = "SPARSYNC_TIMEOUT_S=%g plus %g s" % (daemon_timeout,
                                                                     _DAEMON_GRACE_S)
        cudart = os.environ.get("SPARSYNC_CUDART", "")  # for CUDA tensors; "": the default
        client = C.Client(path, token, local, connect_s, cudart, job_token_file=token_file)
        for var, fallback, key in (("SPARSYNC_RANK", "SLURM_PROCID", "rank"),
                                   ("SPARSYNC_SIZE", "SLURM_NTASKS", "size")):
            name, expected = _env_int(var, fallback, None)
            if expected is not None and expected != client.world[key]:
                client.close()
                raise SparsyncError(
                    "sparsyncd at '%s' gives this worker %s %d, but %s=%d (local rank %d from "
                    "%s): the daemons' SPARSYNC_NUM_NODES and SPARSYNC_LOCAL_SIZE must match how "
                    "the workers were started" % (path, key, client.world[key], name, expected,
                                                  local, local_var or "the default"))
        _state.client = client
        _state.world = client.world
        try:
            _sets.init_process_sets(process_sets)
        except BaseException:
            shutdown()
            raise
    atexit.register(shutdown)


def shutdown():
    """Says goodbye to the daemon and releases every shared region."""
    with _state.lock:
        if _state.client is not None:
            _state.client.close()
        _state.client = None
        _state.world = None
        _sets.reset()
        _state.named.clear()
        _state.first_specs.clear()
        _state.in_flight.clear()
        _state.handles.clear()


def is_initialized():
    return _state.client is not None


_world, rank, size, local_rank, local_size, cross_rank, cross_size = world_accessors(_state)


def mpi_threads_supported():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts the daemon's timeline: a Chrome trace (Perfetto, chrome://tracing) of where each
    tensor and merge group spends its time (docs/operations.md). `file_path` is a file on the
    daemon's machine, made absolute here; "{node}" in it stands for the node's rank (one file per
    node); without it only node 0 records, as Horovod's coordinator does. Each worker may call
    it: the first call of a node starts its daemon's file, the others change nothing. Starting
    another file closes the current one. `mark_cycles` is accepted for Horovod's signature and
    has no effect (the coordinator has no negotiation cycles to mark)."""
    path = os.fsencode(os.path.abspath(os.fspath(file_path)))
    if not path:
        raise SparsyncError("start_timeline needs a file path")
    _client_or_raise().timeline(path, _TIMELINE_ANSWER_S)


def stop_timeline():
    """Stops the daemon's timeline and closes its file (valid JSON). Without one, nothing."""
    _client_or_raise().timeline(b"", _TIMELINE_ANSWER_S)


# ---------------------------------------------------------------------------------------------
# Shared buffers


def _auto_name(kind, ps=None):
    """The next name of an unnamed op of `kind`, counted per process set (`ps`, None for the
    global set), so that the members of a set agree on it whatever other sets did."""
    key = kind if ps is None else (ps.process_set_id, kind)
    n = _state.noname.get(key, 0)
    _state.noname[key] = n + 1
    return "%s.noname.%d" % (kind, n)


class _Pending:
    """A posted op: `finish` makes its result after a successful wait; `restore`, called after
    the wait whatever its outcome, puts back the data of a tensor that lives in the region
    (sparsync._torch_state.release_region)."""

    __slots__ = ("kind", "key", "reg", "temporary", "finish", "restore")

    def __init__(self, kind, key, reg, temporary, finish, restore=lambda: None):
        self.kind, self.key, self.reg, self.temporary, self.finish = (
            kind, key, reg, temporary, finish)
        self.restore = restore


def _register(client, name, op, wire, shape, reduce_op, root, members, group):
    """client.register; `members` (a process set's global ranks) only when not the global set,
    `group` (key, size) only for a part of a grouped collective."""
    extra = {}
    if members is not None:
        extra["members"] = members
    if group is not None:
        extra["group"] = group
    return client.register(name, op, wire, shape, reduce_op, root, **extra)


def _daemon_name(key, name, spec):
    """The name the daemon knows a named op by: `name` with the first spec it was used with,
    `name#<digest of the spec>` with any other. A script may call one name with another shape
    or root later (Horovod allows it); under one daemon name, a worker re-registering it while
    another worker of its node still held the old spec would be a mismatch that fails the job.
    Every rank calls a name with the same specs in the same order, so all agree on each."""
    first = _state.first_specs.setdefault(key, spec)
    if spec == first:
        return name
    longer = "%s#%s" % (name, _digest(repr(spec), 6).hex())
    return longer if len(longer.encode()) <= W.MAX_NAME_BYTES else name


def _registration(kind, name, op, wire, shape, reduce_op, root, members=None, group=None):
    """A registration for a named op (kept and reused while its spec is unchanged)."""
    key = (kind, name)
    spec = (op, wire, tuple(shape), reduce_op, root, members, group)
    reg = _state.named.get(key)
    if reg is not None and reg.spec == spec:
        return reg
    if reg is not None:
        _state.named.pop(key)
        _client().unregister(reg)
    reg = _register(_client(), _daemon_name(key, name, spec), op, wire, shape, reduce_op, root,
                    members, group)
    reg.spec = spec
    _state.named[key] = reg
    return reg


def _enqueue(kind, tensor, name, op, reduce_op, root, finish, prescale=1.0, ps=None,
             in_place=False):
    """Registers (or reuses) and posts `tensor`'s op; `ps` is the resolved process set (None:
    the global set), whose namespace the name is put in. `in_place`: the result goes back into
    `tensor` (finish does that, with _land); a tensor that already lives in the op's region from
    its last in-place op there is not copied in."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("expected a torch.Tensor, got %s" % type(tensor).__name__)
    with _state.lock:
        client = _client()
        wire, sent_dtype = _wire_dtype(kind, tensor.dtype, reduce_op)
        src = tensor.detach()
        if src.dim() == 0 and kind == "allgather":
            src = src.reshape(1)
        shape = tuple(src.shape)
        temporary = name is None
        members = _sets.members(ps)
        group = _current_group()
        if temporary:
            name = _sets.full_name(ps, _auto_name(kind, ps))
            with _collective_errors():
                reg = _register(client, name, op, wire, shape, reduce_op, root, members, group)
            key = None
        else:
            name = _sets.full_name(ps, name)
            key = (kind, name)
            if key in _state.in_flight:
                raise SparsyncError("a %s named '%s' is already in flight; synchronize it first"
                                    % (kind, name))
            with _collective_errors():
                reg = _registration(kind, name, op, wire, shape, reduce_op, root, members, group)
        buf = kept = None
        try:
            buf = _buffer_view(reg, sent_dtype)
            flat = src.reshape(-1)
            if not (in_place and _region_owner(reg, buf) is tensor and _lives_in(tensor, buf)):
                if not temporary:
                    kept = _release_region(reg, buf)
                # A broadcast's result overwrites every rank's region but the root's.
                if flat.numel() and not (kind == "broadcast" and root != rank()):
                    buf.copy_(flat)  # one pass, converting dtype and device on the way
            if flat.numel() and prescale != 1.0:
                buf.mul_(prescale)
            client.post(reg)
        except BaseException:
            _restore_region(buf, kept)
            if temporary:
                client.unregister(reg)
            raise
        if key is not None:
            _state.in_flight.add(key)
        handle = _state.next_handle
        _state.next_handle += 1
        _state.handles[handle] = _Pending(kind, key, reg, temporary,
                                          lambda: finish(reg, sent_dtype),
                                          lambda: _restore_region(buf, kept))
        return handle


def _land(reg, sent_dtype, output):
    """Puts an in-place op's result, in `reg`'s region, into `output`. No copy where `output`
    may simply become a tensor over the region (sparsync._torch_state.may_move_into_region) and
    no other tensor lives there; a named op's region then stays with `output` until the name's
    next op, which moves it out first unless it is `output` again, in place. Otherwise one
    copy, converting the dtype."""
    region = _buffer_view(reg, sent_dtype)
    owner = _region_owner(reg, region)
    if owner is output and _lives_in(output, region):
        return output
    if owner is None and _may_move_into_region(output, region):
        _move_into_region(output, region)
        _give_region(reg, output)
        return output
    output.copy_(region.view(output.shape))  # one pass, converting the dtype on the way
    return output


def poll(handle):
    """True when the operation behind `handle` has finished (synchronize will not block)."""
    if isinstance(handle, _Deferred):
        return all(poll(h) for h in handle.parts)
    with _state.lock:
        p = _state.handles.get(handle)
        if p is None:
            raise ValueError("unknown sparsync handle %r" % (handle,))
        try:
            return _client().try_wait(p.reg)
        except SparsyncError:
            return True  # synchronize raises it


def _synchronize_deferred(handle):
    """Synchronizes every part (also after one failed: none stays in flight), then finishes."""
    if handle.done:
        raise ValueError("sparsync handle %r was already synchronized" % (handle,))
    handle.done = True
    results, error = [], None
    for h in handle.parts:
        try:
            results.append(synchronize(h))
        except BaseException as e:  # noqa: B902 -- re-raised below, after the other parts
            error = error or e
    if error is not None:
        raise error
    return handle.finish(*results)


def synchronize(handle):
    """Waits for the operation behind `handle` and returns its output tensor."""
    if isinstance(handle, _Deferred):
        return _synchronize_deferred(handle)
    with _state.lock:
        p = _state.handles.pop(handle, None)
        if p is None:
            raise ValueError("unknown sparsync handle %r" % (handle,))
        client = _client()
    try:
        _wait(client, p.reg)  # without the lock: other threads may post
        with _state.lock:
            return p.finish()
    finally:
        with _state.lock:
            p.restore()
            if p.key is not None:
                _state.in_flight.discard(p.key)
            if p.temporary and _state.client is client:
                client.unregister(p.reg)


# ---------------------------------------------------------------------------------------------
# allreduce


def _reduce_op(average, op):
    if op is None:
        op = Sum if average is False else Average
    elif average is not None:
        raise ValueError("op and average are mutually exclusive")
    if op == Adasum:
        raise SparsyncError("Adasum is not supported by sparsync; use Average or Sum")
    if op not in (Average, Sum):
        raise ValueError("unknown reduce op %r" % (op,))
    return op


def _allreduce_async(tensor, output, average, name, op, prescale_factor, postscale_factor,
                     ps=None):
    if op in (Min, Max, Product, Adasum):  # exact, by an allgather (_torch_collectives)
        return reduce_by_allgather_async(tensor, output, op, name, prescale_factor,
                                         postscale_factor, ps)
    op = _reduce_op(average, op)
    integer = not (tensor.is_floating_point() or tensor.is_complex())
    wire_op = Sum if integer else op  # the daemon sums integers; the average is taken here
    shape, dtype, device = tensor.shape, tensor.dtype, tensor.device
    members = None if ps is None else len(ps.ranks)

    def finish(reg, sent_dtype):
        exact = not (integer and op == Average) and postscale_factor == 1.0
        if output is not None and exact:
            return _land(reg, sent_dtype, output)  # the region holds the result as it is
        result = _buffer_view(reg, sent_dtype).reshape(shape)
        if integer and op == Average:
            result = torch.div(result, size() if members is None else members,
                               rounding_mode="floor")
        if postscale_factor != 1.0:
            result = result * postscale_factor
        if output is None:
            return result.to(dtype=dtype, device=device, copy=True)
        output.copy_(result)
        return output

    return _enqueue("allreduce", tensor, name, W.OP_ALLREDUCE, wire_op, 0, finish,
                    prescale_factor, ps, in_place=output is tensor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    ps = _sets.resolve(process_set, "allreduce")
    return _allreduce_async(tensor, None, average, name, op, prescale_factor, postscale_factor,
                            ps)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    ps = _sets.resolve(process_set, "allreduce")
    return _allreduce_async(tensor, tensor, average, name, op, prescale_factor, postscale_factor,
                            ps)


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """The average (default) or sum of `tensor` over all workers (over the members of
    `process_set`: only they call it), as a new tensor."""
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    out = synchronize(allreduce_async(compressed, average, name, op, prescale_factor,
                                      postscale_factor, process_set))
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


# ---------------------------------------------------------------------------------------------
# allgather and broadcast


def allgather_async(tensor, name=None, process_set=None):
    ps = _sets.resolve(process_set, "allgather")
    rest, dtype, device = tuple(tensor.shape[1:]), tensor.dtype, tensor.device

    def finish(reg, sent_dtype):
        raw, dim0 = _client().allgather_result(reg)
        out = torch.from_numpy(raw)
        out = out.view(sent_dtype) if out.numel() else torch.empty(0, dtype=sent_dtype)
        return out.reshape((dim0,) + rest).to(dtype=dtype, device=device)

    return _enqueue("allgather", tensor, name, W.OP_ALLGATHER, Sum, 0, finish, ps=ps)


def allgather(tensor, name=None, process_set=None):
    """Concatenation of every worker's `tensor` along dim 0, in rank order (of the members of
    `process_set`, in rank order, which is their order in the set)."""
    return synchronize(allgather_async(tensor, name, process_set))


def _broadcast_async(tensor, output, root_rank, name, ps=None):
    shape, dtype, device = tensor.shape, tensor.dtype, tensor.device
    root = _sets.check_root(ps, root_rank)

    def finish(reg, sent_dtype):
        result = _buffer_view(reg, sent_dtype).reshape(shape)
        if output is None:
            return result.to(dtype=dtype, device=device, copy=True)
        return _land(reg, sent_dtype, output)

    return _enqueue("broadcast", tensor, name, W.OP_BROADCAST, Sum, root, finish, ps=ps,
                    in_place=output is tensor)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    ps = _sets.resolve(process_set, "broadcast")
    return _broadcast_async(tensor, None, root_rank, name, ps)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    ps = _sets.resolve(process_set, "broadcast")
    return _broadcast_async(tensor, tensor, root_rank, name, ps)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """`tensor` of rank `root_rank`, as a new tensor on every worker (on every member of
    `process_set`; root_rank is a global rank, a member of the set)."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _unregister_named(keys):
    with _state.lock:
        for key in keys:
            reg = _state.named.pop(key, None)
            if reg is not None and _state.client is not None:
                _state.client.unregister(reg)


def broadcast_parameters(params, root_rank=0):
    """Overwrites every tensor of `params` (a state_dict or (name, tensor) pairs) with root's."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
    else:
        raise ValueError("invalid params of type %s" % type(params))
    handles, keys = [], []
    try:
        for name, p in items:
            if p is None:
                continue
            target = p.data if isinstance(p, torch.nn.Parameter) else p
            bname = "broadcast_parameters.%s" % name
            handles.append(broadcast_async_(target, root_rank, bname))
            keys.append(("broadcast", bname))
        for h in handles:
            synchronize(h)
    finally:
        _unregister_named(keys)


def _object_from_bytes(data):
    # The job's own ranks sent it (Horovod unpickles the same way). torch 2.6 made weights_only
    # the default, which refuses arbitrary objects; 1.13 knows the argument too.
    return torch.load(io.BytesIO(data), weights_only=False)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """`obj` of rank `root_rank` (pickled), on every worker (every member of `process_set`)."""
    ps = _sets.resolve(process_set, "broadcast_object")
    _sets.check_root(ps, root_rank)
    name = name or _auto_name("broadcast_object", ps)
    if rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf, pickle_protocol=pickle.HIGHEST_PROTOCOL)
        payload = torch.from_numpy(np.frombuffer(buf.getvalue(), dtype=np.uint8).copy())
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    length = broadcast(length, root_rank, name + ".len", process_set)
    if rank() != root_rank:
        payload = torch.zeros(int(length.item()), dtype=torch.uint8)
    payload = broadcast(payload, root_rank, name + ".data", process_set)
    _unregister_named([("broadcast", _sets.full_name(ps, name + ".len")),
                       ("broadcast", _sets.full_name(ps, name + ".data"))])
    if rank() == root_rank:
        return obj
    return _object_from_bytes(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=None):
    """A list of every worker's `obj` (every member's of `process_set`), in rank order."""
    ps = _sets.resolve(process_set, "allgather_object")
    name = name or _auto_name("allgather_object", ps)
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    payload = torch.from_numpy(np.frombuffer(buf.getvalue(), dtype=np.uint8).copy())
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name + ".len",
                      process_set)
    data = allgather(payload, name + ".data", process_set)
    _unregister_named([("allgather", _sets.full_name(ps, name + ".len")),
                       ("allgather", _sets.full_name(ps, name + ".data"))])
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(_object_from_bytes(data[offset:offset + n].numpy().tobytes()))
        offset += n
    return out


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Makes every worker's optimizer state (and hyperparameters) equal to root's."""
    state = broadcast_object(optimizer.state_dict(), root_rank, "broadcast_optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)



# ---------------------------------------------------------------------------------------------
# The rest of Horovod's names (modules that build on the functions above)

from sparsync import _torch_elastic as elastic  # noqa: E402
from sparsync._torch_elastic import HostsUpdatedInterrupt  # noqa: E402,F401
from sparsync._torch_basics import (  # noqa: E402,F401
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    mpi_built,
    mpi_enabled,
    nccl_built,
    rocm_built,
)
from sparsync._torch_collectives import (  # noqa: E402,F401
    Max,
    Min,
    Product,
    alltoall,
    alltoall_async,
    barrier,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reduce_by_allgather_async,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
)
from sparsync._torch_process_sets import (  # noqa: E402,F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from sparsync._torch_sync_bn import SyncBatchNorm  # noqa: E402,F401
from sparsync import ddp  # noqa: E402,F401  (sparsync.torch.ddp: the DDP communication hook)
