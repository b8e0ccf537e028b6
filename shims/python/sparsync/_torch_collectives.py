"""Horovod's collectives beyond allreduce/allgather/broadcast, for sparsync.torch.

The daemon has three exact collectives (a sum or average allreduce, an allgather whose first
dimensions may differ, a broadcast). Everything here is built on them, exactly:

- Min, Max, Product and Adasum: an allgather of every rank's tensor, then the same reduction on
  every rank, in rank order (bit-identical everywhere). It moves size() times the bytes of an
  allreduce: meant for metrics and small tensors, not for gradients.
- grouped_allreduce / grouped_allgather: every tensor of the group is posted before any is
  waited for, so the daemon negotiates them together and fuses those that are ready together
  into one bucket; the group is not an atomic unit of the daemon (Horovod's is).
- alltoall: an allgather of the split sizes, then of the tensors; each rank keeps its slices.
- reducescatter: an allreduce, then each rank keeps its block of rows.
- barrier: an allreduce of one element.
- join: see join().

With a process set (process_set=, _torch_process_sets) each of them runs among the set's members
alone: the allgathers and allreduces underneath are the set's, and sizes and positions are the
set's (alltoall's splits and reducescatter's blocks are per set rank, Min/Max/Product/Adasum
reduce the members' tensors in set-rank order). join() covers the global set only.
"""

import time

import torch

from sparsync import _torch_process_sets as sets
from sparsync import _torch_state as shared
from sparsync._errors import SparsyncError
from sparsync import torch as _hvd

Adasum = shared.Adasum
Min = 3
Max = 4
Product = 5  # Horovod's values for these reduce ops

_BY_ALLGATHER = (Min, Max, Product, Adasum)


def _parts_names(name, n):
    return [None] * n if name is None else ["%s.%d" % (name, i) for i in range(n)]


def _adasum_pair(a, b):
    """Adasum of two vectors (Maleki et al., MLSys 2021): each keeps the part of itself that is
    not already along the other; computed in float64."""
    dot = torch.dot(a, b)
    na, nb = torch.dot(a, a), torch.dot(b, b)
    ca = 1.0 - dot / (2.0 * na) if na > 0 else torch.tensor(1.0, dtype=a.dtype)
    cb = 1.0 - dot / (2.0 * nb) if nb > 0 else torch.tensor(1.0, dtype=a.dtype)
    return ca * a + cb * b


def _adasum(gathered):
    """Horovod's recursive-halving Adasum as a tree: ranks 2i and 2i+1 are combined first, then
    neighbouring pairs, and so on; the same tree on every rank."""
    n = gathered.shape[0]
    if n & (n - 1):
        raise ValueError("Adasum needs a power-of-two number of ranks, not %d" % n)
    level = [gathered[i].reshape(-1).to(torch.float64) for i in range(n)]
    while len(level) > 1:
        level = [_adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0].reshape(gathered.shape[1:]).to(gathered.dtype)


def _process_set_arg(ps):
    """The process_set argument that makes a public function run on resolved set `ps`."""
    return sets.global_process_set if ps is None else ps


def reduce_by_allgather_async(tensor, output, op, name, prescale_factor, postscale_factor,
                              ps=None):
    """allreduce_async for Min, Max, Product and Adasum (module docstring); `ps`: the resolved
    process set (None: the global set)."""
    if op == Adasum and not tensor.is_floating_point():
        raise ValueError("Adasum reduces floating-point tensors, not %s" % tensor.dtype)
    src = tensor.detach()
    if prescale_factor != 1.0:
        src = src * prescale_factor
    shape, dtype, device = tensor.shape, tensor.dtype, tensor.device
    gname = None if name is None else "reduce.%d.%s" % (op, name)
    handle = _hvd.allgather_async(src.reshape((1,) + tuple(shape)), name=gname,
                                  process_set=_process_set_arg(ps))

    def finish(gathered):
        if op == Min:
            result = gathered.amin(0)
        elif op == Max:
            result = gathered.amax(0)
        elif op == Product:
            result = gathered.prod(0, dtype=gathered.dtype)
        else:
            result = _adasum(gathered)
        if postscale_factor != 1.0:
            result = result * postscale_factor
        if output is None:
            return result.to(dtype=dtype, device=device)
        output.copy_(result.reshape(output.shape))
        return output

    return shared.Deferred([handle], finish)


# ---------------------------------------------------------------------------------------------
# Grouped operations


def _grouped(start, tensors, name, process_set, *args, **kwargs):
    """One handle over `start(tensor, *args, name=part name, process_set=..., **kwargs)` of
    every tensor, all posted before any is waited for, as one group of the daemon: it schedules
    none of them before all are ready on every rank (Horovod's grouped ops), and fuses those that
    can be (same op and dtype, within SPARSYNC_BUCKET_BYTES). The group's key comes from its
    name (an unnamed group's: a count of unnamed groups, per process set), the same on every
    rank."""
    ps = sets.resolve(process_set, "grouped collective")  # refused before any part is posted
    tensors = list(tensors)
    with shared.state.lock:
        group_name = sets.full_name(ps, "group." + name if name is not None
                                    else _hvd._auto_name("group", ps))
    with shared.grouped(group_name, len(tensors)):
        handles = [start(t, *args, name=n, process_set=process_set, **kwargs)
                   for t, n in zip(tensors, _parts_names(name, len(tensors)))]
    return shared.Deferred(handles, lambda *outs: list(outs))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    return _grouped(_hvd.allreduce_async, tensors, name, process_set, average, op=op,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    return _grouped(_hvd.allreduce_async_, tensors, name, process_set, average, op=op,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """The allreduce of each tensor of `tensors`, as a list, negotiated together."""
    compression = compression or _hvd.Compression.none
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    outs = _hvd.synchronize(grouped_allreduce_async(list(compressed), average, name, op,
                                                    prescale_factor, postscale_factor,
                                                    process_set))
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    return _hvd.synchronize(grouped_allreduce_async_(tensors, average, name, op,
                                                     prescale_factor, postscale_factor,
                                                     process_set))


def grouped_allgather_async(tensors, name=None, process_set=None):
    return _grouped(_hvd.allgather_async, tensors, name, process_set)


def grouped_allgather(tensors, name=None, process_set=None):
    """The allgather of each tensor of `tensors`, as a list, negotiated together."""
    return _hvd.synchronize(grouped_allgather_async(tensors, name, process_set))


# ---------------------------------------------------------------------------------------------
# alltoall, reducescatter, barrier


def _even_splits(rows, n, what):
    if rows % n:
        raise ValueError("%s without splits needs a first dimension divisible by size() = %d, "
                         "got %d" % (what, n, rows))
    return [rows // n] * n


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    ps = sets.resolve(process_set, "alltoall")
    n, me = sets.set_size(ps), sets.set_rank(ps)
    rows = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        sent = _even_splits(rows, n, "alltoall")
    else:
        sent = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(sent) != n or any(s < 0 for s in sent) or sum(sent) != rows:
            raise ValueError("alltoall splits must be %d non-negative counts summing to the first "
                             "dimension %d, got %s" % (n, rows, sent))
    base = None if name is None else "alltoall." + name
    h_splits = _hvd.allgather_async(torch.tensor([sent], dtype=torch.int64),
                                    None if base is None else base + ".splits", process_set)
    h_data = _hvd.allgather_async(tensor, None if base is None else base + ".data",
                                  process_set)

    def finish(all_splits, data):
        matrix = all_splits.tolist()  # matrix[src][dst]: rows src sends to dst
        pieces, start = [], 0
        for src in range(n):
            offset = start + sum(matrix[src][:me])
            pieces.append(data[offset:offset + matrix[src][me]])
            start += sum(matrix[src])
        received = torch.tensor([matrix[src][me] for src in range(n)], dtype=torch.int32)
        return torch.cat(pieces), received

    return shared.Deferred([h_splits, h_data], finish)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Rank r sends rows splits[d] (in order) to each rank d and receives the rows every rank sends
    it, concatenated in rank order. Without splits the rows are split evenly. Returns the output,
    and also the received splits when `splits` was given (Horovod's contract). With a process
    set, r and d are ranks within the set (splits has ps.size() entries)."""
    output, received = _hvd.synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


def _reducescatter_rows(rows, n):
    """Rows each rank keeps: as even as possible, the lower ranks one more (Horovod's)."""
    return [rows // n + (1 if r < rows % n else 0) for r in range(n)]


def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    ps = sets.resolve(process_set, "reducescatter")
    op = _hvd.Average if op is None else op
    if op not in (_hvd.Average, _hvd.Sum):
        raise ValueError("reducescatter supports op=Average or op=Sum")
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with a first dimension")
    n, me = sets.set_size(ps), sets.set_rank(ps)
    counts = _reducescatter_rows(tensor.shape[0], n)
    start = sum(counts[:me])
    handle = _hvd.allreduce_async(tensor, None, None if name is None else "reducescatter." + name,
                                  op, prescale_factor, postscale_factor, process_set)
    return shared.Deferred([handle], lambda full: full[start:start + counts[me]].clone())


def reducescatter(tensor, name=None, compression=None, op=None, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's block of rows of the reduction (default Average) of `tensor` over all ranks
    (over the members of `process_set`, blocks by set rank)."""
    compression = compression or _hvd.Compression.none
    compressed, ctx = compression.compress(tensor)
    out = _hvd.synchronize(reducescatter_async(compressed, name, op, process_set,
                                               prescale_factor, postscale_factor))
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=None, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _grouped(reducescatter_async, tensors, name, process_set, op=op,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def grouped_reducescatter(tensors, name=None, compression=None, op=None, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatter of each tensor of `tensors`, as a list, negotiated together."""
    compression = compression or _hvd.Compression.none
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    outs = _hvd.synchronize(grouped_reducescatter_async(list(compressed), name, op, process_set,
                                                        prescale_factor, postscale_factor))
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def sparse_allreduce_async(tensor, name=None, op=None, process_set=None):
    """The reduction of a sparse COO tensor, as Horovod does it: an allgather of every rank's
    indices and values (exact); synchronize() gives a coalesced sparse tensor, its values
    divided by size() (the set's size) for Average (the default)."""
    ps = sets.resolve(process_set, "sparse_allreduce")
    op = _hvd.Average if op is None else op
    if op not in (_hvd.Average, _hvd.Sum):
        raise ValueError("sparse_allreduce supports op=Average or op=Sum")
    grad = tensor.coalesce()
    base = None if name is None else "sparse_allreduce." + name
    hi = _hvd.allgather_async(grad.indices().t().contiguous(),
                              None if base is None else base + ".indices", process_set)
    hv = _hvd.allgather_async(grad.values().contiguous(),
                              None if base is None else base + ".values", process_set)
    n = sets.set_size(ps)

    def finish(indices, values):
        if op == _hvd.Average:
            values = values / n
        return torch.sparse_coo_tensor(indices.t(), values, grad.shape).coalesce()

    return shared.Deferred([hi, hv], finish)


def barrier(process_set=None):
    """Returns when every rank (every member of `process_set`) has called barrier()."""
    _hvd.allreduce(torch.zeros(1, dtype=torch.int32), name="sparsync.barrier", op=_hvd.Sum,
                   process_set=process_set)


# ---------------------------------------------------------------------------------------------
# join


def join(device=-1):
    """This rank is out of data: until every rank has called join(), its node's daemon takes its
    part in every collective the others run (DistributedOptimizer steps, explicit allreduce,
    allgather, grouped ops, ...) as nothing: zeros in a sum (an average still divides by
    size(), as Horovod's does), no rows in an allgather; a broadcast from a joined rank fails the
    job. Returns the rank that called join() last. Call it with nothing in flight (synchronize
    first). Waits as long as the other ranks train; a failed job raises HorovodInternalError.
    `device` is accepted for Horovod's signature."""
    with shared.state.lock:
        conn = shared.client()
    with shared.collective_errors():
        return conn.join()

