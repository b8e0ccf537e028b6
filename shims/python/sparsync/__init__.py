"""sparsync: gradient reduction through a per-node daemon, with the Horovod API.

Use ``import sparsync.torch as hvd`` in training scripts and ``sparsyncrun`` to launch them;
``sparsync.run(func, np=4)`` launches a function, as ``horovod.run`` does.
"""

from sparsync import _run_api
from sparsync import run  # the launcher's module, made callable: sparsync.run(func, np=...)
from sparsync._errors import SparsyncError

_run_api.make_callable(run)

__all__ = ["SparsyncError", "run"]
__version__ = "0.1.0"
