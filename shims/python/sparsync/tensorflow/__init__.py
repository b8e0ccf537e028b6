"""The Horovod TensorFlow 2 API over sparsyncd: ``import sparsync.tensorflow as hvd``.

Every collective is an op of the sparsync op library (shims/tensorflow): an AsyncOpKernel that
copies its tensor into a shared region registered with the node's daemon, posts it and returns;
the result is copied back and the op completed on one of the library's threads, so TensorFlow's
executor never waits on the network and independent collectives are in flight together.
Explicit allreduce/allgather/broadcast are exact; gradients reduced by DistributedGradientTape
or a DistributedOptimizer use the GRADIENT op, which the daemon may compress
(SPARSYNC_COMPRESSOR, or ``sparsify=TopK(density=...)``).

CPU tensors only: a tensor on a GPU is copied to the host by TensorFlow's placement (the ops have
CPU kernels only); the CUDA IPC intake of sparsync.torch is not used by this shim yet.
"""

from sparsync._compressors import (  # noqa: F401  (part of sparsync.tensorflow)
    DGC,
    Dense,
    GaussianK,
    GlobalTopK,
    RandomK,
    Sparsify,
    Threshold,
    TopK,
    Wangni,
)
from sparsync._errors import SparsyncError
from sparsync.tensorflow import _ops
from sparsync.tensorflow._basics import (  # noqa: F401
    Adasum,
    Average,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
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
from sparsync.tensorflow._collectives import (  # noqa: F401
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_object,
    broadcast_variables,
    grouped_allreduce,
)
from sparsync.tensorflow._compression import Compression  # noqa: F401
from sparsync.tensorflow._tape import DistributedGradientTape, DistributedOptimizer  # noqa: F401

__all__ = [
    "SparsyncError", "Average", "Sum", "Adasum", "Compression", "init", "shutdown",
    "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "broadcast_variables",
    "broadcast_object", "allgather_object", "DistributedGradientTape", "DistributedOptimizer",
    "Sparsify", "TopK", "GlobalTopK", "RandomK", "Threshold", "GaussianK", "Wangni", "DGC",
    "Dense", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "mpi_threads_supported", "start_timeline",
    "stop_timeline",
]

_ops.register_gradients(rank)
