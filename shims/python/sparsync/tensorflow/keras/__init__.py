"""The Horovod Keras API over sparsyncd: ``import sparsync.tensorflow.keras as hvd`` (or
``sparsync.keras``), for the Keras 3 that TensorFlow 2.21 brings (keras 3.15 here).

DistributedOptimizer reduces the gradients in the optimizer's ``apply`` (which ``model.fit``'s
train step and ``apply_gradients`` call), inside the step's tf.function under ``model.fit``: each
gradient's reduction is posted as soon as backward has produced it (sparsync.tensorflow._tape).
"""

import keras

from sparsync._errors import SparsyncError
from sparsync.tensorflow import (  # noqa: F401  (Horovod's keras module has these too)
    DGC,
    Adasum,
    Average,
    Compression,
    Dense,
    GaussianK,
    GlobalTopK,
    RandomK,
    Sum,
    Threshold,
    TopK,
    Wangni,
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_object,
    broadcast_variables,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    grouped_allreduce,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from sparsync.tensorflow._tape import GradientReducer, check_unsupported
from sparsync.tensorflow.keras import callbacks  # noqa: F401

__all__ = [
    "DistributedOptimizer", "load_model", "callbacks", "init", "shutdown", "is_initialized",
    "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "allreduce",
    "grouped_allreduce", "allgather", "allgather_object", "broadcast", "broadcast_variables",
    "broadcast_object", "Compression", "Average", "Sum", "Adasum", "SparsyncError", "TopK",
    "GlobalTopK", "RandomK", "Threshold", "GaussianK", "Wangni", "DGC", "Dense", "mpi_built",
    "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "mpi_threads_supported", "start_timeline", "stop_timeline",
]

# The optimizers load_model wraps (besides custom_optimizers).
_KERAS_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "Adafactor", "Ftrl",
                     "Lamb", "Lion", "Nadam", "RMSprop", "Muon")


def _distributed_class(base, reducer_args):
    """A subclass of the Keras optimizer class `base` whose apply() first reduces the gradients
    over every worker. It keeps `base`'s name and module, so that a saved model names the plain
    optimizer and loads without sparsync."""

    def apply(self, grads, trainable_variables=None):
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(self._trainable_variables))
        reducer = self.__dict__.get("_sparsync_reducer")
        if reducer is None:
            reducer = GradientReducer(**reducer_args)
            self.__dict__["_sparsync_reducer"] = reducer
        grads = reducer.reduce(list(grads), variables)
        return base.apply(self, grads, trainable_variables)

    return type(base.__name__, (base,), {"apply": apply, "__module__": base.__module__,
                                          "_sparsync_distributed": True})


def _reducer_args(compression, sparse_as_dense, op, sparsify):
    return {"op": op, "compression": compression, "sparsify": sparsify,
            "sparse_as_dense": sparse_as_dense}


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, sparsify=None, **unsupported):
    """A copy of the Keras `optimizer` (same class and configuration, fresh state) whose
    gradients are averaged (op=Sum: summed) over every worker before they are applied.
    `sparsify`, e.g. ``hvd.TopK(density=0.001)``, chooses the daemon's compressor for them.

    Same contract as horovod.tensorflow.keras.DistributedOptimizer; backward_passes_per_step
    other than 1 (use Keras's own gradient_accumulation_steps, which reduces every pass),
    gradient_predivide_factor, groups and process sets are not supported."""
    check_unsupported("DistributedOptimizer", **unsupported)
    if backward_passes_per_step != 1:
        raise SparsyncError("DistributedOptimizer: backward_passes_per_step other than 1 is not "
                            "supported by sparsync; Keras's gradient_accumulation_steps works "
                            "(each pass is reduced)")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("DistributedOptimizer wraps a keras.optimizers.Optimizer, got %s"
                        % type(optimizer).__name__)
    args = _reducer_args(compression, sparse_as_dense, op, sparsify)
    GradientReducer(**args)  # the arguments' errors now, not at the first step
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return _distributed_class(type(optimizer), args).from_config(config)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, sparse_as_dense=False, op=Average, sparsify=None,
               **kwargs):
    """keras.models.load_model, with the model's optimizer (a Keras one, or one of
    `custom_optimizers`) made a DistributedOptimizer with these settings."""
    args = _reducer_args(compression, sparse_as_dense, op, sparsify)
    classes = [getattr(keras.optimizers, n) for n in _KERAS_OPTIMIZERS
               if hasattr(keras.optimizers, n)]
    classes += list(custom_optimizers or [])
    objects = {cls.__name__: _distributed_class(cls, args) for cls in classes}
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects, **kwargs)
