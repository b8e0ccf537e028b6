"""DistributedGradientTape and the gradient reduction that the optimizers share.

Each gradient is reduced by the GRADIENT op under the name "gradient.<variable name>", which the
daemon may compress (SPARSYNC_COMPRESSOR, or `sparsify=` for one tape or optimizer). Inside a
tf.function (model.fit, a decorated training step) each reduction is an op that depends only on
its own gradient, so TensorFlow's executor posts it as soon as backward has produced that
gradient and the exchange overlaps the rest of backward. Eagerly, tape.gradient returns every
gradient at once (TensorFlow has no per-gradient hook there); the reductions then run together in
one tf.function, all in flight at the same time.
"""

import tensorflow as tf

from sparsync._compressors import wire_of
from sparsync._errors import SparsyncError
from sparsync.tensorflow import _basics, _ops
from sparsync.tensorflow._collectives import sparse_allreduce, unique_names
from sparsync.tensorflow._compression import Compression

_GRADIENT_DTYPES = (tf.float32, tf.float64, tf.float16, tf.bfloat16)


def check_unsupported(who, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                      process_set=None, **ignored):
    if gradient_predivide_factor != 1.0 or num_groups or groups is not None or \
            process_set is not None:
        raise SparsyncError("%s: gradient_predivide_factor, num_groups, groups and process_set "
                            "are not supported by sparsync" % who)


class GradientReducer:
    """How one tape or optimizer reduces its gradients: the reduce op, Horovod's compression,
    the daemon's compressor, and what to do with IndexedSlices."""

    def __init__(self, op=_basics.Average, compression=Compression.none, sparsify=None,
                 sparse_as_dense=False):
        if op not in (_basics.Average, _basics.Sum):
            raise SparsyncError("gradients can be reduced with op=Average or op=Sum only")
        _basics.size()  # fail early (ValueError) when init() was not called
        self.op = op
        self.compression = compression
        self.compressor, self.density = wire_of(sparsify)
        self.sparse_as_dense = sparse_as_dense
        self._eager_fns = {}  # names of the reduced gradients -> tf.function reducing them

    def _one(self, grad, name):
        if isinstance(grad, tf.IndexedSlices):
            if not self.sparse_as_dense:
                return sparse_allreduce(grad, self.op, name)
            grad = tf.convert_to_tensor(grad)
        if grad.dtype not in _GRADIENT_DTYPES:
            raise SparsyncError("gradient '%s' has dtype %s; gradients are reduced as float32, "
                                "float64, float16 or bfloat16" % (name, grad.dtype.name))
        compressed, ctx = self.compression.compress(grad)
        out = _ops.allreduce(compressed, self.op, name, gradient=True, compressor=self.compressor,
                             density=self.density)
        return self.compression.decompress(out, ctx)

    def reduce(self, grads, variables):
        """The reduced gradients of `variables` (lists of the same length; a None gradient
        stays None: the graph is the same on every rank, so it is None on all of them)."""
        names = unique_names("gradient", variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        out = list(grads)
        if not present:
            return out
        if tf.executing_eagerly():
            key = tuple(names[i] for i in present)
            fn = self._eager_fns.get(key)
            if fn is None:
                fn = tf.function(lambda gs: [self._one(g, n) for g, n in zip(gs, key)],
                                 autograph=False)
                self._eager_fns[key] = fn
            reduced = _ops.run_eagerly(fn, [grads[i] for i in present])
        else:
            reduced = [self._one(grads[i], names[i]) for i in present]
        for i, r in zip(present, reduced):
            out[i] = r
        return out


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False,
                            op=_basics.Average, sparsify=None, **unsupported):
    """Wraps a recorded tf.GradientTape so that gradient() returns gradients reduced over every
    worker (averaged by default). `sparsify`, e.g. ``hvd.TopK(density=0.01)``, chooses the
    daemon's compressor for these gradients.

    Same contract as horovod.tensorflow.DistributedGradientTape; gradient_predivide_factor,
    groups and process sets are not supported."""
    check_unsupported("DistributedGradientTape", **unsupported)
    reducer = GradientReducer(op, compression, sparsify, sparse_as_dense)
    base = gradtape.__class__

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = base.gradient(self, target, sources, output_gradients, unconnected_gradients)
        flat = reducer.reduce(tf.nest.flatten(grads), tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, flat)

    cls = type(base.__name__, (base,), {"gradient": gradient, "__module__": base.__module__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the recorded tape itself, shared
    tape.sparsync_reducer = reducer
    return tape


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=_basics.Average, sparsify=None,
                         **unsupported):
    """A Keras optimizer (see sparsync.tensorflow.keras.DistributedOptimizer) or a
    tf.compat.v1.train.Optimizer whose gradients are reduced over every worker."""
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        from sparsync.tensorflow.keras import DistributedOptimizer as keras_optimizer
        return keras_optimizer(optimizer, name=name, compression=compression,
                               sparse_as_dense=sparse_as_dense,
                               backward_passes_per_step=backward_passes_per_step, op=op,
                               sparsify=sparsify, **unsupported)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError("DistributedOptimizer wraps a Keras optimizer or a "
                        "tf.compat.v1.train.Optimizer, got %s" % type(optimizer).__name__)
    check_unsupported("DistributedOptimizer", **unsupported)
    if backward_passes_per_step != 1:
        raise SparsyncError("DistributedOptimizer: backward_passes_per_step other than 1 is not "
                            "supported by sparsync")
    return _V1Optimizer(optimizer, GradientReducer(op, compression, sparsify, sparse_as_dense),
                        name or "Distributed" + type(optimizer).__name__, use_locking)


class _V1Optimizer(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients reduces over every worker."""

    def __init__(self, optimizer, reducer, name, use_locking):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = self._reducer.reduce([g for g, _ in pairs], [v for _, v in pairs])
        return list(zip(grads, [v for _, v in pairs]))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)
