"""sparsync: gradient reduction through a per-node daemon, with the Horovod API.

Use ``import sparsync.torch as hvd`` in training scripts and ``sparsyncrun`` to launch them.
"""

from sparsync._errors import SparsyncError

__all__ = ["SparsyncError"]
__version__ = "0.1.0"
