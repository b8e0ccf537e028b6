"""Explicit collectives of sparsync.tensorflow: allreduce, allgather, broadcast and what is built
on them. Always exact (the daemon never compresses these). Eagerly, a failure raises
SparsyncError; inside a tf.function it surfaces as TensorFlow's error when the graph runs, with
the same message.
"""

import pickle

import numpy as np
import tensorflow as tf

from sparsync._errors import SparsyncError
from sparsync.tensorflow import _basics, _ops
from sparsync.tensorflow._compression import Compression

# What the daemon sums, and what it moves bit for bit (allgather, broadcast).
_REDUCIBLE = (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64)
_MOVABLE = _REDUCIBLE + (tf.uint8,)


def _identity(t):
    return t


def wire_form(tensor, kind):
    """(tensor as sent, function from the result back to the tensor's dtype) for a `kind`
    ('allreduce' or another) collective; SparsyncError for a dtype sparsync cannot carry."""
    dt = tensor.dtype
    if dt in (_REDUCIBLE if kind == "allreduce" else _MOVABLE):
        return tensor, _identity
    if kind != "allreduce" and dt == tf.bool:
        return tf.cast(tensor, tf.uint8), lambda t: tf.cast(t, tf.bool)
    if kind != "allreduce" and dt == tf.int8:
        return tf.bitcast(tensor, tf.uint8), lambda t: tf.bitcast(t, tf.int8)
    if dt in (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16):
        return tf.cast(tensor, tf.int32), lambda t: tf.cast(t, dt)
    raise SparsyncError("sparsync does not support tensors of %s" % dt.name)


def reduce_op(average, op):
    """The reduce op of Horovod's (average, op) pair: Average unless told otherwise."""
    if op is None:
        op = _basics.Sum if average is False else _basics.Average
    elif average is not None:
        raise ValueError("op and average are mutually exclusive")
    if op == _basics.Adasum:
        raise SparsyncError("Adasum is not supported by sparsync; use Average or Sum")
    if op not in (_basics.Average, _basics.Sum):
        raise ValueError("unknown reduce op %r" % (op,))
    return op


def _check_unsupported(process_set):
    if process_set is not None:
        raise SparsyncError("process sets are not supported by sparsync")


def _dense_allreduce(tensor, op, name, prescale_factor, postscale_factor):
    sent, back = wire_form(tensor, "allreduce")
    integer = not sent.dtype.is_floating
    if prescale_factor != 1.0:
        sent = sent * tf.cast(prescale_factor, sent.dtype)
    # The daemon sums integers; their average is taken here (floor, as sparsync.torch does).
    out = _ops.allreduce(sent, _basics.Sum if integer else op, name)
    if integer and op == _basics.Average:
        out = tf.math.floordiv(out, tf.cast(_basics.size(), out.dtype))
    if postscale_factor != 1.0:
        out = out * tf.cast(postscale_factor, out.dtype)
    return back(out)


def sparse_allreduce(slices, op, name):
    """An IndexedSlices reduced by gathering every rank's values and indices (exact)."""
    base = name or ""
    values = _ops.allgather(slices.values, base + ".values" if base else "")
    indices = _ops.allgather(slices.indices, base + ".indices" if base else "")
    if op == _basics.Average:
        values = values / tf.cast(_basics.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=None, ignore_name_scope=False):
    """The average (default) or sum of `tensor` over all workers. `name` identifies it in the
    job: give one when the same op may run at the same time as another unnamed one."""
    _check_unsupported(process_set)
    op = reduce_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        return _ops.run_eagerly(sparse_allreduce, tensor, op, name)
    tensor = tf.convert_to_tensor(tensor)

    def run():
        compressed, ctx = compression.compress(tensor)
        out = _dense_allreduce(compressed, op, name, prescale_factor, postscale_factor)
        return compression.decompress(out, ctx)

    return _ops.run_eagerly(run)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, name=None, process_set=None):
    """allreduce of each tensor, all in flight together (names `name`.0, .1, ...)."""
    base = name or "grouped_allreduce"
    return [allreduce(t, average, device_dense, device_sparse, compression, op, prescale_factor,
                      postscale_factor, "%s.%d" % (base, i), process_set)
            for i, t in enumerate(tensors)]


def allgather(tensor, name=None, process_set=None, ignore_name_scope=False):
    """Every worker's `tensor` concatenated along dimension 0, in rank order (the first
    dimensions may differ; the others must match). A scalar is gathered as a vector."""
    _check_unsupported(process_set)
    tensor = tf.convert_to_tensor(tensor)

    def run():
        sent, back = wire_form(tf.reshape(tensor, [1]) if tensor.shape.rank == 0 else tensor,
                               "allgather")
        return back(_ops.allgather(sent, name))

    return _ops.run_eagerly(run)


def broadcast(tensor, root_rank, name=None, process_set=None, ignore_name_scope=False):
    """`tensor` of rank `root_rank`, on every worker."""
    _check_unsupported(process_set)
    root_rank = int(root_rank)
    if not 0 <= root_rank < _basics.size():
        raise ValueError("root_rank %d is not a rank of this job (size %d)"
                         % (root_rank, _basics.size()))
    tensor = tf.convert_to_tensor(tensor)

    def run():
        sent, back = wire_form(tensor, "broadcast")
        return back(_ops.broadcast(sent, root_rank, name))

    return _ops.run_eagerly(run)


def variable_name(v):
    """A variable's name in the job: its Keras path, else its TensorFlow name without ':0'."""
    name = getattr(v, "path", None) or getattr(v, "name", None) or "variable"
    return name[:-2] if name.endswith(":0") else name


def unique_names(prefix, variables):
    """prefix.<variable name> for each variable; repeated names get #1, #2, ... in order."""
    seen, out = {}, []
    for v in variables:
        base = "%s.%s" % (prefix, variable_name(v))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.append(base if k == 0 else "%s#%d" % (base, k))
    return out


def broadcast_variables(variables, root_rank=0, process_set=None):
    """Assigns rank `root_rank`'s value to every variable of `variables`, all broadcasts in
    flight together. Eagerly it runs them; in a graph it returns the op that does."""
    _check_unsupported(process_set)
    variables = list(variables)
    names = unique_names("broadcast_variables", variables)

    def assign_all():
        return tf.group(*[v.assign(broadcast(v, root_rank, n)) for v, n in zip(variables, names)])

    if not tf.executing_eagerly():
        return assign_all()
    def run():
        assign_all()  # a tf.function returns tensors, not the grouping op

    if variables:
        _ops.run_eagerly(tf.function(run, autograph=False))
    return None


def _bytes_of(obj):
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """`obj` of rank `root_rank` (pickled), on every worker. Eager only."""
    name = name or "broadcast_object"
    payload = _bytes_of(obj) if _basics.rank() == root_rank else np.zeros(0, np.uint8)
    length = broadcast(tf.constant([payload.size], tf.int64), root_rank, name + ".len")
    if _basics.rank() != root_rank:
        payload = np.zeros(int(length.numpy()[0]), np.uint8)
    data = broadcast(tf.constant(payload), root_rank, name + ".data")
    return obj if _basics.rank() == root_rank else pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=None):
    """A list of every worker's `obj` (pickled), in rank order. Eager only."""
    name = name or "allgather_object"
    payload = _bytes_of(obj)
    sizes = allgather(tf.constant([payload.size], tf.int64), name + ".len").numpy()
    data = allgather(tf.constant(payload), name + ".data").numpy()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(data[offsets[i]:offsets[i + 1]].tobytes()) for i in range(len(sizes))]

